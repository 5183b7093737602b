"""pcapdecomp.core.fingerprint against percona-toolkit itself.

The oracle is the installed percona-toolkit: tests/data/fingerprint/pt_oracle.pl loads /usr/bin/pt-fingerprint
(or /usr/bin/pt-query-digest) and streams queries through its own QueryRewriter::fingerprint, so hundreds of
queries cost one Perl start. A few queries also go through the real `pt-fingerprint --query` command line to
show the oracle prints the same, and Query IDs are read from real pt-query-digest reports.
Without percona-toolkit these tests are skipped, naming the missing tool.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
from corpus import CORPUS  # noqa: E402
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ptoracle import PERL, PT_FINGERPRINT, PT_QUERY_DIGEST, PtOracle, query_bytes, query_text

from pcapdecomp.core.fingerprint import digest_fingerprint, fingerprint, query_id

CORPUS_REPORTS = CORPUS / "percona-toolkit-tcpdump-text" / "expected"

needs_pt_fingerprint = pytest.mark.skipif(
    PT_FINGERPRINT is None or PERL is None, reason="pt-fingerprint (percona-toolkit) or perl is not installed"
)
needs_pt_query_digest = pytest.mark.skipif(
    PT_QUERY_DIGEST is None or PERL is None, reason="pt-query-digest (percona-toolkit) or perl is not installed"
)


@pytest.fixture(scope="module")
def pt_fingerprint():
    if PT_FINGERPRINT is None or PERL is None:
        pytest.skip("pt-fingerprint (percona-toolkit) or perl is not installed")
    oracle = PtOracle(PT_FINGERPRINT)
    yield oracle
    oracle.close()


@pytest.fixture(scope="module")
def pt_digest_fingerprint():
    if PT_QUERY_DIGEST is None or PERL is None:
        pytest.skip("pt-query-digest (percona-toolkit) or perl is not installed")
    oracle = PtOracle(PT_QUERY_DIGEST, match_embedded_numbers=False)
    yield oracle
    oracle.close()


# ---------------------------------------------------------------------------------------------------------------
# The hand-picked queries: one or more per step of the algorithm, plus the statement shapes we capture in practice.

MD5 = "fbc5e685a5d3d45aa1d0347fdb7c4d35"

HAND_PICKED: list[str] = [
    # early returns
    "SELECT /*!40001 SQL_NO_CACHE */ * FROM `film`",
    "SELECT /*!40001 SQL_NO_CACHE */ * FROM film",  # no backtick: not mysqldump's shape
    "select /*!40001 SQL_NO_CACHE */ * FROM `film`",  # that check is case-sensitive
    " SELECT /*!40001 SQL_NO_CACHE */ * FROM `film`",
    "REPLACE /*db.tbl:3/7*/ INTO checksums SELECT 'db', 'tbl', 3, COUNT(*) FROM `db`.`tbl` WHERE id >= 5",
    "SELECT 1 /*a.b:1/2*/",
    "SELECT 1 /*a.b:12/2*/",
    "administrator command: Quit",
    "administrator command: Init DB",
    "administrator command: Ping\n",
    "Administrator command: Quit",
    "administrator command:Quit",
    "CALL foo(1, 2, 3)",
    "  call   db.proc_Name('x', 2)",
    "CALL `Weird Name`(1)",
    "call p",  # no parenthesis: not the CALL shortcut
    "CALL p()",
    "call\tp(1)(2)",
    "call (1)",
    "callx(1)",
    # multi-row INSERT / REPLACE
    "INSERT INTO t VALUES (1,'a'),(2,'b'),(3,'c')",
    "insert into t(a,b) values(1, 2) , (3, 4)",
    "INSERT IGNORE INTO t VALUES (1),(2)",
    "INSERT  IGNORE INTO t VALUES (1),(2)",
    "REPLACE INTO `film_actor` VALUES (1,1,'2006-02-15 04:05:03'),(1,23,'2006-02-15 04:05:03')",
    "INSERT INTO t VALUES (1,2),(3,4) ON DUPLICATE KEY UPDATE b=VALUES(b)",
    "INSERT INTO t (a) VALUES (1) ON DUPLICATE KEY UPDATE a = a + 1, c = 'x'",
    "INSERT t VALUES (1),(2)",
    "INSERT INTO t SET a=1, b='two', c=NULL",
    "INSERT INTO t SELECT * FROM u WHERE x IN (1,2)",
    "insert into t values ('a)', 'b'), ('c', 'd')",
    "INSERT INTO t\nVALUES\n(1,\n2),\n(3,4)",
    "INSERT INTO t VALUE (1), (2)",
    "INSERT LOW_PRIORITY INTO t VALUES (1),(2)",
    "insert into t values(1) , ( 2 )",
    "INSERT INTO t VALUES (?, ?), (?, ?)",
    # comments
    "select \n--bar\n foo",
    "select foo--bar\nfoo",
    "select foo -- bar\n",
    "select foo -- it's a comment\n",
    "select foo # hash comment\nfrom t",
    "select foo # it's\nfrom t",
    "select /* c */ 1",
    "select /*\nmulti\nline*/ 1",
    "select /*!40101 hint */ 1",
    "select /*!*/ 1",
    "select /**/ 1",
    "select /**/ 1 /* x */",
    "select /* a */ 1 /* b */ 2",
    "/* -- S++ SU ABORTABLE -- spd_user: x */SELECT DISTINCT a FROM b WHERE c=1001",
    "SELECT /*+ MAX_EXECUTION_TIME(1000) */ * FROM t",
    "select 1 -- trailing comment",
    "select 1 --",
    "select a--b from t",
    "select 5--3",
    "select '-- not a comment' from t",
    "select \"# not a comment\" from t -- real one\n",
    "select 1 #\r\nfrom t",
    "select 1 /* unterminated",
    "select 1 */",
    # USE
    "use `foo`",
    "USE db1",
    "use db\n",
    "use db\n\n",
    "use  db",
    " use db",
    "use db; select 1",
    "use db -- comment",
    "USE /* c */ db",
    "use ſ",
    "uſe db",
    # strings and escapes
    "select 'hello', '\nhello\n', \"hello\", '\\'' from foo",
    "select '\\\\' from foo",
    "select 'it''s' from t",
    "select \"a \\\" b\" from t",
    "select 'a\\'b', 'c' from t",
    "select '' from t",
    "select \"\" , '' from t",
    "select 'unterminated from t",
    "select \"unterminated from t",
    "select 'a' 'b' 'c'",
    "select 'x\"y', \"p'q\"",
    "SELECT 'Ünïcödé', 'ⓤⓝⓘ', '日本語' FROM t",
    "SELECT Ünïcödé_1 FROM tÄble2 WHERE naïve = 3",
    "SELECT col FROM t WHERE name LIKE 'abc%' ESCAPE '\\\\'",
    "UPDATE groups_search SET charter = '   -------3\\'\\' XXXXXXXXX.\\n \\n -----', show = 'Y' WHERE group_id='aa'",
    "select _utf8mb4'abc' collate utf8mb4_bin",
    "select N'national'",
    "select x'CAFE', X'cafe', b'0101', B'1'",
    # numbers
    "select null, 5.001, 5001. from foo",
    "select 0e0, +6e-30, -6.00 from foo where a = 5.5 or b=0.5 or c=.5",
    "select 0x0, x'123', 0b1010, b'10101' from foo",
    "select 0xFF, 0XFF, 0xdeadBEEF from t",
    "select 1e10, 1E10, 1.5e+3, -1e-3",
    "select -5, +5, - 5, 3-2, 3 - 2, a-1, a+1, a*2, a/2",
    "select foo_1 from foo_2_3",
    "select 123foo from 123foo",
    "select 123_foo from 123_foo",
    "SELECT * FROM prices.rt_5min where id=1",
    "select * from db2.t3 join db4.`t5` using (id6)",
    f"SELECT * FROM db.{MD5}_temp where id=1",
    f"SELECT * FROM db.temp_{MD5} where id=1",
    f"SELECT * FROM db.temp_{MD5.upper()} where id=1",
    "select 1.2.3.4, 10.0.0.1, '10.0.0.1'",
    "select * from t where d > '2024-01-01 00:00:00' and d < 20240101",
    "select a from b where c = ? and d = ?",
    "SELECT 9223372036854775807, -9223372036854775808, 18446744073709551615",
    "select 1bx+-.5",
    "select x1, b2, 3x, 4b",
    # NULL, booleans
    "select * from t where a is null and b is not NULL and c <=> Null",
    "select nullable, null_col, isnull(x) from t",
    "SELECT * FROM tbl WHERE id=1 AND flag=true AND trueflag=FALSE",
    "select TRUE, False, true_col, is_true from t",
    # IN and VALUES lists
    "select * from foo where a in (5) and b in (5, 8,9 ,9 , 10)",
    "select * from t where a in ('a', 'b') and b not in (null, 1)",
    "select * from t where a IN(1,2) or b In ( 3 )",
    "select * from t where a in ((1,2),(3,4))",
    "select * from t where (a,b) in ((1,2),(3,4))",
    "select * from t where a in (select b from u)",
    "select * from t where a in ()",
    "select * from t where a in (1,2)(3,4)",
    "select * from t where a in (?, ?, ?)",
    "insert into foo(a, b, c) values(2, 4, 5)",
    "insert into foo(a, b, c) value(2, 4, 5)",
    "insert into foo(a, b, c) values (2, 4, 5) , (2,4,5)",
    "insert into t values(now(), 1)",
    "select min(1), join (1), bin(7), in(1)",
    "select x.in(1)",
    "SELECT * FROM t WHERE a IN (" + ", ".join(str(i) for i in range(3000)) + ")",
    "SELECT * FROM t WHERE a IN (" + ", ".join(f"'k{i}'" for i in range(1000)) + ") AND b = 1",
    "INSERT INTO t (a, b) VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(2000)),
    "REPLACE INTO t VALUES " + ",".join(f"({i},{i * 3},'{'x' * 20}')" for i in range(1000)),
    # UNION
    "select 1 union select 2 union select 4",
    "select 1 union all select 2 union all select 4",
    "select * from (select 1 union all select 2 union all select 4) as x join (select 2 union select 2 union select 3) as y",
    "select a from t where x=1 union select a from t where x=2",
    "select a from t union select b from u",
    "SELECT 1 UNION SELECT 1 UNION ALL SELECT 1",
    "select 1 union  select 2",
    "select 1\nunion\nselect 2",
    " union select 1",
    "select ſelect 1 union ſelect 1",
    "(select 1) union (select 2)",
    " union ".join(["select a from t where id = 1"] * 60),
    # LIMIT
    "select * from foo limit 5",
    "select * from foo limit 5, 10",
    "select * from foo limit 5,10",
    "select * from foo limit 5 offset 10",
    "select * from foo LIMIT 5 OFFSET 10",
    "select * from (select * from t limit 1) x limit 2",
    "select * from (select * from t limit 1) x limit 2, 3",  # Perl's s/// has no /g here: first LIMIT only
    "select * from (select * from t limit 1, 2) x limit 3 offset 4",
    "select * from t limit ?",
    "select * from t limit  5",
    "select limit_col from t limit 5",
    # ORDER BY ... ASC
    "select c from t where i=1 order by c asc",
    "select * from t where i=1 order by a, b ASC, d DESC, e asc",
    "select * from t where i=1      order            by \n      a,  b          ASC, d    DESC,    \n\n    e asc",
    "select * from t order by a ascii",
    "select * from t order by a asc limit 1 asc",
    "select * from t order by a desc, b asc",
    "select * from (select * from t order by a asc) x order by b asc",
    "select * from t group by a asc order by b",
    "select * from t order by aſc",
    "select * from t order by a aſc",
    "select * from t order by a ASC",
    "select * from t order by",
    "select * from t order by asc",
    "select * from t ORDER BY a\tASC",
    "select * from t order  by a asc",
    "select `order by x asc` from t order by a asc",
    # whitespace and case
    "select   foo",
    " select  * from\nfoo where a = 5",
    "\t\n SELECT 1 \n",
    "SELECT 1\r\n",
    "SELECT 1\n\n",
    "SELECT\x0b1",
    "SELECT\x0c1\x0c\x0c2",
    "SELECT 1\u00a0FROM t",
    "SELECT 1\u2028FROM t\x85",
    "SELECT * FROM T WHERE A = 5",
    "SELECT İ, K, ß FROM Tİ",
    # Unicode case folding would let these match keywords; Perl on bytes and re.ASCII do not.
    "select * from t where a ın (1,2) and b İN (3)",
    "select * from t lımıt 5",
    "select 1 unıon select 1",
    "ınsert ınto t values (1),(2)",
    "SELECT \x1c1\x1d2\x1e3\x1f",
    "",
    " ",
    "\n",
    "?",
    ";",
    "select 1;",
    "select 1; select 2",
    # binary-ish text
    "select '\x00\x01\x02' from t",
    "select * from t where a = \x00",
    "INSERT INTO blobs VALUES ('\udcff\udcfe\udc80', 1)",
    "SELECT \udcc0\udcc1 FROM t",
    "select '\\0\\b\\n\\r\\t\\Z'",
    # SHOW, SET, other statements
    "SHOW TABLES",
    "SHOW FULL PROCESSLIST",
    "SHOW VARIABLES LIKE 'max_connections'",
    "SHOW /*!50000 GLOBAL */ STATUS",
    "SHOW CREATE TABLE `db`.`t1`",
    "SET NAMES utf8mb4",
    "SET autocommit=0",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET @a = 5, @b := 'x'",
    "SET GLOBAL max_connections = 1000",
    "SELECT @@version_comment LIMIT 1",
    "select @@session.tx_isolation",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "START TRANSACTION READ ONLY",
    "LOCK TABLES t1 READ, t2 WRITE",
    "UNLOCK TABLES",
    "XA START 'xid1'",
    "FLUSH TABLES WITH READ LOCK",
    "LOAD DATA INFILE '/tmp/foo.txt' INTO TABLE db.tbl",
    "CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(32) DEFAULT 'x')",
    "ALTER TABLE t ADD COLUMN c2 INT DEFAULT 0 AFTER c1",
    "DROP TABLE IF EXISTS t_2024_01",
    "TRUNCATE TABLE log_2024",
    "EXPLAIN SELECT * FROM t WHERE id = 3",
    "DESCRIBE t",
    "KILL QUERY 12345",
    "PREPARE stmt1 FROM 'SELECT * FROM t WHERE id = ?'",
    "EXECUTE stmt1 USING @a",
    "DEALLOCATE PREPARE stmt1",
    "SELECT BENCHMARK(1000000, MD5('x'))",
    "SELECT SLEEP(2)",
    "select sleep(0.5), benchmark(10, 1+1)",
    "DO SLEEP(1)",
    "HANDLER t READ `PRIMARY` = (5)",
    "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 10) SELECT * FROM c",
    "SELECT JSON_EXTRACT(doc, '$.a[0]') FROM t WHERE doc->>'$.b' = 'x'",
    "SELECT a FROM t WHERE b BETWEEN 1 AND 10 AND c REGEXP '^[0-9]+$'",
    "SELECT CASE WHEN a > 1 THEN 'big' ELSE 'small' END FROM t",
    "SELECT * FROM t1 LEFT JOIN t2 ON t1.id = t2.t1_id WHERE t2.id IS NULL",
    "SELECT COUNT(*) FROM t FORCE INDEX (idx_a) WHERE a > 100 FOR UPDATE",
    "SELECT ... FROM t WHERE a = :name AND b = $1",
    # sysbench oltp_read_write
    "SELECT c FROM sbtest1 WHERE id=5023",
    "SELECT c FROM sbtest3 WHERE id BETWEEN 4831 AND 4930",
    "SELECT SUM(k) FROM sbtest2 WHERE id BETWEEN 5012 AND 5111",
    "SELECT c FROM sbtest1 WHERE id BETWEEN 4 AND 103 ORDER BY c",
    "SELECT DISTINCT c FROM sbtest1 WHERE id BETWEEN 4 AND 103 ORDER BY c",
    "UPDATE sbtest1 SET k=k+1 WHERE id=5001",
    "UPDATE sbtest1 SET c='93145485302-45328546212-33215124587-57428123812' WHERE id=4999",
    "DELETE FROM sbtest1 WHERE id=5002",
    "INSERT INTO sbtest1 (id, k, c, pad) VALUES (5002, 4988, '12345-67890', '11111-22222')",
    # ORM shapes
    "SELECT `users`.* FROM `users` WHERE `users`.`id` = 1 LIMIT 1",
    "SELECT t0.id AS id_1, t0.name AS name_2 FROM accounts t0 WHERE t0.id IN (1, 2, 3) ORDER BY t0.id ASC",
    "UPDATE `orders` SET `status` = 'shipped', `updated_at` = '2024-05-01 10:00:00.123456' WHERE `orders`.`id` = 77",
]


def _mismatches(queries, ours, theirs) -> list[tuple[str, str, str]]:
    return [(q[:200], ours(q), theirs(q)) for q in queries if ours(q) != theirs(q)]


@needs_pt_fingerprint
def test_hand_picked_queries_match_pt_fingerprint(pt_fingerprint):
    assert len(HAND_PICKED) >= 200
    assert _mismatches(HAND_PICKED, fingerprint, pt_fingerprint) == []


@needs_pt_query_digest
def test_hand_picked_queries_match_pt_query_digest_copy(pt_digest_fingerprint):
    assert _mismatches(HAND_PICKED, digest_fingerprint, pt_digest_fingerprint) == []


def test_the_two_copies_differ_only_in_booleans():
    # pt-query-digest's QueryRewriter has one extra substitution (percona-toolkit issue 965553).
    query = "SELECT * FROM tbl WHERE id=1 AND flag=true AND trueflag=FALSE"
    assert fingerprint(query) == "select * from tbl where id=? and flag=true and trueflag=false"
    assert digest_fingerprint(query) == "select * from tbl where id=? and flag=? and trueflag=?"
    unaffected = [q for q in HAND_PICKED if not re.search(r"true|false", q, re.IGNORECASE)]
    assert all(fingerprint(q) == digest_fingerprint(q) for q in unaffected)


@pytest.mark.parametrize(
    "options",
    [
        {"match_md5_checksums": True},
        {"match_embedded_numbers": True},
        {"match_md5_checksums": True, "match_embedded_numbers": True},
    ],
)
@needs_pt_fingerprint
def test_pt_fingerprint_options_match(options):
    oracle = PtOracle(PT_FINGERPRINT, **options)
    try:
        assert _mismatches(HAND_PICKED, lambda q: fingerprint(q, **options), oracle) == []
    finally:
        oracle.close()


@needs_pt_query_digest
def test_preserve_embedded_numbers_matches_pt_query_digest():
    oracle = PtOracle(PT_QUERY_DIGEST, match_embedded_numbers=True)
    try:
        ours = lambda q: digest_fingerprint(q, preserve_embedded_numbers=True)  # noqa: E731
        assert _mismatches(HAND_PICKED, ours, oracle) == []
    finally:
        oracle.close()


# The oracle calls the tool's function directly; the command line must print the same thing.
CLI_SAMPLE = [
    "SELECT * FROM t WHERE a IN (1, 2, 3) ORDER BY b ASC LIMIT 10, 20",
    "INSERT INTO t VALUES (1,'a'),(2,'b')",
    "use db\n",
    "administrator command: Quit\n",
    "select 'x' -- comment\n",
    "  CALL P(1)",
    "select ' \\' ' , \"\\\"\" from t where c = 0xFF",
    "SELECT Ünï FROM t WHERE x = 'é'\t\n",
    "SELECT \udcc0 FROM t",
    "select 1 union select 2 union select 3",
    "SELECT * FROM tbl WHERE flag=true",
]


@needs_pt_fingerprint
@pytest.mark.parametrize("query", CLI_SAMPLE)
def test_command_line_prints_the_same(query, pt_fingerprint):
    # No check=True: pt-fingerprint 3.2.1 exits 1 after printing (`exit main()` returns print's 1).
    run = subprocess.run([PT_FINGERPRINT, b"--query=" + query_bytes(query)], capture_output=True)
    assert run.stderr == b""
    out = run.stdout
    assert out.endswith(b"\n")
    assert query_text(out[:-1]) == pt_fingerprint(query) == fingerprint(query)


# ---------------------------------------------------------------------------------------------------------------
# Generated SQL-ish text, from tokens chosen to hit every regex and its edges.

_KEYWORDS = [
    "select", "SELECT", "Select", "from", "where", "and", "or", "in", "IN", "not in", "values", "VALUES", "value",
    "union", "UNION ALL", "union all", "order by", "ORDER BY", "order  by", "asc", "ASC", "desc", "limit",
    "LIMIT", "offset", "null", "NULL", "true", "FALSE", "call", "CALL", "use", "USE", "insert into",
    "INSERT IGNORE INTO", "replace into", "on duplicate key update", "set", "join", "administrator command: ",
    "SELECT /*!40001 SQL_NO_CACHE */ * FROM `", "ascii", "aſc", "ſelect", "K", "İ",
    "ı", "ın", "lımıt", "\u212a", "\x1c",
]
_IDENTIFIERS = ["t", "t1", "db.t2", "`tbl`", "`a b`", "foo_1", "123foo", "col", "x", "b", "e", "xb", "id",
                f"db.{MD5}_x", f"t_{MD5}", "Ünï", "ß"]
_NUMBERS = ["0", "1", "42", "-7", "+3", "3.14", ".5", "5.", "1e10", "-2E-3", "0x1F", "0XAB", "0b101", "?",
            "9999999999999999999", "1-2", "1.2.3"]
_STRINGS = ["'a'", "''", "'it''s'", "'a\\'b'", "\"q\"", "\"a\\\"b\"", "'x\ny'", "'-- no'", "'# no'", "'(1,2)'",
            "'", "\"", "'\\\\'", "'é'", "'\x00'", "'\udcff'"]
_PUNCTUATION = ["(", ")", "(?)", "(1, 2)", "((1),(2))", ",", ";", "=", "<=>", "*", "+", "-", ".", "`", "@", "?",
                "/*", "*/", "/*!", "/* c */", "/*!50100 x */", "--", "-- c", "#", "# c", "/*a.b:1/2*/", "\\"]
_SPACES = ["", " ", " ", " ", "  ", "\n", "\t", "\r\n", "\f", "\v", " \n ", "\u00a0", "\x85"]

_token = st.one_of(
    st.sampled_from(_KEYWORDS), st.sampled_from(_IDENTIFIERS), st.sampled_from(_NUMBERS),
    st.sampled_from(_STRINGS), st.sampled_from(_PUNCTUATION),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=3),
)
sqlish = st.lists(st.tuples(_token, st.sampled_from(_SPACES)), max_size=40).map(
    lambda pairs: "".join(token + space for token, space in pairs)
)


@needs_pt_fingerprint
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=sqlish)
def test_generated_sql_matches_pt_fingerprint(query, pt_fingerprint):
    assert fingerprint(query) == pt_fingerprint(query)


@needs_pt_query_digest
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=sqlish)
def test_generated_sql_matches_pt_query_digest_copy(query, pt_digest_fingerprint):
    assert digest_fingerprint(query) == pt_digest_fingerprint(query)


# ---------------------------------------------------------------------------------------------------------------
# Query IDs, read from pt-query-digest's own reports.

SLOW_LOG_QUERIES = [
    "SELECT c FROM sbtest1 WHERE id=5023",
    "select * from t where a = 1 and b = true",  # digest-only abstraction of true
    "SELECT * FROM t WHERE a IN (1, 2, 3) ORDER BY b ASC LIMIT 10, 20",
    "INSERT INTO t (a, b) VALUES (1, 'x'), (2, 'y')",
    "UPDATE t SET c = 'Ünïcödé' WHERE id = 9",
    "SELECT a\nFROM t\nWHERE b = 'multi\nline'",
    "select 1 union select 2 union select 3",
    "CALL refresh_stats(3)",
]


def _slow_log(queries: list[str]) -> bytes:
    entries = []
    for i, query in enumerate(queries):
        entries.append(
            f"# Time: 2024-01-01T00:00:{i:02d}.000000Z\n"
            f"# User@Host: app[app] @ localhost []  Id: {10 + i}\n"
            f"# Query_time: 0.00{i + 1}000  Lock_time: 0.000010 Rows_sent: 1  Rows_examined: {i}\n"
            f"SET timestamp={1704067200 + i};\n"
            f"{query};\n"
        )
    return query_bytes("".join(entries))


@needs_pt_query_digest
def test_query_id_matches_pt_query_digest_report(tmp_path):
    log = tmp_path / "slow.log"
    log.write_bytes(_slow_log(SLOW_LOG_QUERIES))
    limit = ["--limit", "100%:1000"]

    json_out = subprocess.run([PT_QUERY_DIGEST, "--output", "json", *limit, str(log)], capture_output=True,
                              check=True).stdout
    classes = json.loads(json_out)["classes"]
    by_checksum = {c["checksum"]: c["fingerprint"] for c in classes}
    expected = {query_id(digest_fingerprint(q)): digest_fingerprint(q) for q in SLOW_LOG_QUERIES}
    assert {"0x" + checksum: fp for checksum, fp in by_checksum.items()} == expected

    report = subprocess.run([PT_QUERY_DIGEST, *limit, str(log)], capture_output=True, check=True).stdout.decode()
    reported_ids = set(re.findall(r"^# Query \d+: .* ID (0x[0-9A-F]{32}) at byte", report, re.MULTILINE))
    assert reported_ids == set(expected)
    # The "true" query groups under the digest's fingerprint, not pt-fingerprint's.
    assert query_id(fingerprint(SLOW_LOG_QUERIES[1])) not in reported_ids


PROJECT_SLOW_LOGS = sorted((Path(__file__).parent / "data" / "slowlog").glob("*.log"))


@needs_pt_query_digest
@pytest.mark.skipif(not PROJECT_SLOW_LOGS, reason="no slow log fixtures in tests/data/slowlog")
@pytest.mark.parametrize("log", PROJECT_SLOW_LOGS, ids=lambda p: p.name)
def test_every_class_of_a_recorded_slow_log(log):
    # The slow logs recorded for the slow log parser: every class pt-query-digest forms must carry the
    # fingerprint and Query ID we compute from its example statement.
    out = subprocess.run([PT_QUERY_DIGEST, "--output", "json", "--limit", "100%:10000", str(log)],
                         capture_output=True, check=True).stdout
    classes = json.loads(out)["classes"]
    assert classes
    for c in classes:
        example = c["example"]["query"]
        assert (digest_fingerprint(example), query_id(digest_fingerprint(example))) == (
            c["fingerprint"], "0x" + c["checksum"]
        )


def test_query_id_format():
    # Observed in a pt-query-digest 3.2.1 report of "SELECT 1;": "ID 0x1FE1379FE2A31B8D16219655761820A2".
    assert query_id(fingerprint("SELECT 1")) == "0x1FE1379FE2A31B8D16219655761820A2"
    assert query_id("select ?") == "0x" + hashlib.md5(b"select ?").hexdigest().upper()
    # Raw bytes that are not UTF-8 hash as themselves, as Perl's md5_hex does on the slow log's bytes.
    assert query_id(b"select \xc0".decode("utf-8", "surrogateescape")) == (
        "0x" + hashlib.md5(b"select \xc0").hexdigest().upper()
    )


def _corpus_report_blocks() -> list[tuple[str, str]]:
    """(Query ID, example query) from pt-query-digest reports that percona-toolkit keeps as test expectations."""
    blocks = []
    for report in sorted(CORPUS_REPORTS.glob("pt-query-digest_*.txt")):
        text = report.read_text(encoding="utf-8", errors="surrogateescape")
        for block in re.split(r"(?m)^(?=# Query \d+: )", text)[1:]:
            head = re.match(r"# Query \d+: .* ID (0x[0-9A-F]+) at byte", block)
            lines = [line for line in block.splitlines() if line and not line.startswith("#")]
            if head and lines and len(head.group(1)) == 34:
                blocks.append((head.group(1), "\n".join(lines)))
    return blocks


@pytest.mark.skipif(not CORPUS_REPORTS.is_dir(), reason="../shared/corpus is not checked out beside the repo")
def test_query_ids_in_percona_toolkit_expected_reports():
    # Each block prints its example statement first, ending in "\G"; for PREPARE/EXECUTE a converted SELECT
    # follows "# Converted for EXPLAIN". The statement a class is named by is the first one.
    blocks = _corpus_report_blocks()
    assert len(blocks) >= 20
    for qid, example in blocks:
        statement = example.split("\\G")[0].strip()
        assert query_id(digest_fingerprint(statement)) == qid, example
