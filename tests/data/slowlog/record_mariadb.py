"""Record the real MariaDB slow-log fixtures in this folder (run by hand, as root; not part of the test suite).

    python tests/data/slowlog/record_mariadb.py OUTDIR [--tz Asia/Kolkata] [--verbosity query_plan,innodb,explain]

Starts a private mariadbd (--skip-networking, socket in OUTDIR, so it cannot collide with anyone's lab),
runs a varied workload with long_query_time=0 and log_output=FILE,TABLE, restarts the server once (so the
file header appears mid-file), stops it, restarts it without logging and dumps mysql.slow_log to a TSV:
the table is MariaDB's own record of the same entries, an oracle independent of our file parser.
"""
import argparse
import os
import subprocess
import time

import mysql.connector
import pymysql

_args = argparse.ArgumentParser()
_args.add_argument("outdir")
_args.add_argument("--tz", default="UTC", help="TZ of mariadbd: '# Time:' is written in its local time")
_args.add_argument("--verbosity", default="", help="log_slow_verbosity")
ARGS = _args.parse_args()
OUT = os.path.abspath(ARGS.outdir)
TZ = ARGS.tz
DATA = os.path.join(OUT, "data")
SOCK = os.path.join(OUT, "s.sock")
SLOW = os.path.join(OUT, "slow.log")


def start(logging: bool) -> subprocess.Popen:
    args = ["mariadbd", "--no-defaults", f"--datadir={DATA}", f"--socket={SOCK}", "--skip-networking",
            "--user=root", f"--pid-file={OUT}/m.pid", f"--log-error={OUT}/err.log"]
    if logging:
        args += ["--slow-query-log=1", f"--slow-query-log-file={SLOW}", "--long-query-time=0",
                 f"--log-slow-verbosity={ARGS.verbosity}", "--log-output=FILE,TABLE",
                 "--log-slow-admin-statements=1"]
    proc = subprocess.Popen(args, env={**os.environ, "TZ": TZ})
    for _ in range(100):
        if os.path.exists(SOCK):
            try:
                pymysql.connect(unix_socket=SOCK, user="root").close()
                return proc
            except pymysql.err.OperationalError:
                pass
        time.sleep(0.1)
    raise SystemExit("mariadbd did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def workload_1() -> None:
    c = pymysql.connect(unix_socket=SOCK, user="root", client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS)
    cur = c.cursor()
    cur.execute("CREATE DATABASE IF NOT EXISTS shop")
    cur.execute("USE shop")
    cur.execute("CREATE TABLE orders (\n  id INT PRIMARY KEY AUTO_INCREMENT,\n  customer VARCHAR(40) NOT NULL,\n"
                "  note TEXT,\n  amount DECIMAL(10,2)\n) ENGINE=InnoDB")
    cur.execute("INSERT INTO orders (customer, note, amount) VALUES " +
                ",".join(f"('c{i % 7}', 'n{i}', {i}.25)" for i in range(40)))
    c.commit()
    # a '#' comment line inside the statement that looks exactly like a slow-log header
    cur.execute("SELECT customer, SUM(amount)\n# Time: 240501 10:00:00\n# User@Host: fake[fake] @ nowhere []\n"
                "FROM orders GROUP BY customer ORDER BY 2 DESC")
    cur.fetchall()
    # a string literal spanning lines that start with '#', and a blank line inside the statement
    cur.execute("INSERT INTO orders (customer, note) VALUES ('hash', 'line one\n# Query_time: 9.9  Lock_time: 0\n\nend;')")
    c.commit()
    cur.execute("SELECT note FROM orders WHERE customer = 'hash';")
    cur.fetchall()
    cur.execute("SELECT ';' AS semi, '\\\\' AS backslash")
    cur.fetchall()
    cur.execute("/* leading comment */ SELECT COUNT(*) FROM orders WHERE note LIKE '%5%'")
    cur.fetchall()
    cur.execute("SELECT SLEEP(1.2)")  # crosses a second boundary: MariaDB writes a new '# Time:'
    cur.fetchall()
    try:
        cur.execute("SELECT * FROM no_such_table")
    except pymysql.err.ProgrammingError:
        pass
    try:
        cur.execute("INSERT INTO orders (id, customer) VALUES (1, 'dup')")
    except pymysql.err.IntegrityError:
        pass
    cur.execute("UPDATE orders SET amount = amount + 1 WHERE customer = 'c3'")
    c.commit()
    cur.execute("DELETE FROM orders WHERE customer = 'c6' LIMIT 5")
    c.commit()
    cur.execute("SELECT 1 AS a; SELECT 2 AS b")  # multi-statement packet: one entry per statement
    while True:
        cur.fetchall()
        if not cur.nextset():
            break
    cur.execute("PREPARE ps FROM 'SELECT id FROM orders WHERE customer = ? ORDER BY id LIMIT 3'")
    cur.execute("SET @c = 'c2'")
    cur.execute("EXECUTE ps USING @c")
    cur.fetchall()
    cur.execute("DEALLOCATE PREPARE ps")
    cur.execute("SELECT o1.id FROM orders o1 JOIN orders o2 ON o1.customer = o2.customer AND o2.id = o1.id + 7 "
                "ORDER BY o1.note LIMIT 2")
    cur.fetchall()
    c.ping(reconnect=False)
    c.select_db("mysql")  # COM_INIT_DB
    cur.execute("SELECT COUNT(*) FROM shop.orders")
    cur.fetchall()
    cur.execute("FLUSH SLOW LOGS")
    cur.execute("SELECT 'after flush'")
    cur.fetchall()
    c.close()  # COM_QUIT

    # binary protocol: COM_STMT_PREPARE / EXECUTE / CLOSE
    m = mysql.connector.connect(unix_socket=SOCK, user="root", database="shop")
    pc = m.cursor(prepared=True)
    for cust in ("c1", "c4"):
        pc.execute("SELECT id, amount FROM orders WHERE customer = %s ORDER BY id LIMIT 2", (cust,))
        pc.fetchall()
    pc.execute("INSERT INTO orders (customer, amount) VALUES (%s, %s)", ("bin", 3.5))
    m.commit()
    pc.close()
    m.close()


def workload_2() -> None:
    c = pymysql.connect(unix_socket=SOCK, user="root", database="shop")
    cur = c.cursor()
    cur.execute("SELECT COUNT(*)\n  FROM orders\n WHERE amount > 10\n")
    cur.fetchall()
    cur.execute("SELECT SLEEP(0.3)")
    cur.fetchall()
    c.close()


def dump_table(path: str) -> None:
    c = pymysql.connect(unix_socket=SOCK, user="root")
    cur = c.cursor()
    cur.execute("SELECT DATE_FORMAT(start_time, '%Y-%m-%d %H:%i:%s.%f'), user_host, TIME_TO_SEC(query_time), "
                "TIME_TO_SEC(lock_time), rows_sent, rows_examined, db, thread_id, rows_affected, "
                "HEX(sql_text) FROM mysql.slow_log")
    with open(path, "w") as out:
        out.write("start_time\tuser_host\tquery_time\tlock_time\trows_sent\trows_examined\tdb\tthread_id\t"
                  "rows_affected\tsql_text_hex\n")
        for row in cur.fetchall():
            out.write("\t".join(str(v) for v in row) + "\n")
    c.close()


if __name__ == "__main__":
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={DATA}", "--user=root",
                    "--auth-root-authentication-method=normal"], check=True, capture_output=True)
    server = start(logging=True)
    workload_1()
    stop(server)
    server = start(logging=True)  # restart: the server writes its file header again, mid-file
    workload_2()
    stop(server)
    server = start(logging=False)
    dump_table(os.path.join(OUT, "slow_log_table.tsv"))
    stop(server)
