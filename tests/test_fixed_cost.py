"""The fixed cost of a run (docs/speed.md, "The fixed cost of a run"): the shortcuts that make a small analysis
cheaper give what pandas' and pyarrow's own general paths give, on the tables of real captures. Each test builds
the reference with the library's own conversion, aggregation or description and compares value for value and dtype
for dtype."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pandas.api.types import union_categoricals

from pcapdecomp.core import outputs
from pcapdecomp.core.groups import aggregated
from pcapdecomp.core.schema import CATEGORY, CONNECTION_COLUMNS, EXCHANGE_COLUMNS
from pcapdecomp.core.tables import as_declared, concat, frame_of_table
from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
# small and varied: prepared statements, TLS, a proxy, many short connections, a stall, refusals
POINTS = [CAPTURES / s / f for s in ("oltp-prepared", "group-stall-tls13", "proxy-pool", "connection-storm",
                                     "maxthreads", "connection-refused") for f in ("app.pcap", "db.pcap")]


@pytest.fixture(scope="module")
def extractions():
    return {p: extract(p) for p in POINTS if p.exists()}


def _arrow_own_frame(table: pa.Table, columns) -> pd.DataFrame:
    """The table as pyarrow converts it to pandas, with each column in its declared dtype (categorical text with
    its categories in lexical order, as the project declares them)."""
    data = {}
    for c in columns:
        chunked = table.column(c.name)
        if c.dtype == CATEGORY:
            s = chunked.to_pandas()
            data[c.name] = s.cat.set_categories(pd.Index(s.cat.categories, dtype="str").sort_values())
        elif c.dtype == "Int64":
            data[c.name] = chunked.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
        else:
            data[c.name] = chunked.to_pandas(types_mapper={pa.string(): pd.StringDtype("pyarrow"),
                                                           pa.bool_(): pd.BooleanDtype()}.get)
    return pd.DataFrame(data, columns=[c.name for c in columns])


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert [str(t) for t in a.dtypes] == [str(t) for t in b.dtypes]
    for name in a.columns:
        if isinstance(a[name].dtype, pd.CategoricalDtype):
            assert a[name].cat.codes.dtype == b[name].cat.codes.dtype, name


def test_a_table_becomes_the_frame_pyarrows_own_conversion_gives(extractions):
    assert len(extractions) >= 10
    for path, e in extractions.items():
        for name, columns in (("exchanges", EXCHANGE_COLUMNS), ("connections", CONNECTION_COLUMNS)):
            table = e.arrow(name)
            assert table is not None and table.num_rows > 0, (path, name)
            reference = _arrow_own_frame(table, columns)
            _same(as_declared(frame_of_table([table], columns)), reference)  # held as analyze holds it


def test_a_sliced_table_of_two_batches_becomes_the_same_frame(extractions):
    """Several record batches (each with its own dictionaries) and offsets into them, as the lane's batches and a
    sorted table hold them."""
    e = extractions[CAPTURES / "connection-storm" / "db.pcap"]
    table = e.arrow("exchanges")
    half = table.num_rows // 2
    two = pa.Table.from_batches([*table.slice(1, half).to_batches(), *table.slice(half + 1).to_batches()])
    assert two.column("sql").num_chunks >= 2
    _same(as_declared(frame_of_table([two], EXCHANGE_COLUMNS)), _arrow_own_frame(two, EXCHANGE_COLUMNS))


def _pandas_concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Column by column, pd.concat, or union_categoricals for categorical text (lexical categories)."""
    data = {}
    for name in frames[0].columns:
        parts = [f[name] for f in frames]
        if all(isinstance(p.dtype, pd.CategoricalDtype) for p in parts):
            parts = [p.cat.set_categories(pd.Index(p.cat.categories, dtype="str").sort_values()) for p in parts]
            data[name] = pd.Series(union_categoricals(parts, sort_categories=True, ignore_order=True))
        else:
            data[name] = pd.concat(parts, ignore_index=True)
    return pd.DataFrame(data)


def _declared(*frames: pd.DataFrame) -> list[pd.DataFrame]:
    """The frames in their declared dtypes (whole numbers may be held in int32: a part whose column fits it beside
    one whose column does not, or a column of one value, concatenate into another form than pandas': the values)."""
    return [as_declared(f) for f in frames]


def test_concatenated_tables_are_what_pandas_concatenation_gives(extractions):
    points = list(extractions.values())
    for name in ("exchanges", "connections"):
        for i, e in enumerate(points):
            parts = [getattr(e, name), getattr(points[(i + 1) % len(points)], name)]
            _same(*_declared(concat(parts), _pandas_concat(parts)))
            _same(*_declared(concat([parts[0], parts[1].iloc[:0]]), _pandas_concat([parts[0], parts[1].iloc[:0]])))
    # beside a table of no rows (and no categories: a point without a capture), either side of it
    for columns, name in ((EXCHANGE_COLUMNS, "exchanges"), (CONNECTION_COLUMNS, "connections")):
        from pcapdecomp.core.tables import frame

        for e in points:
            for parts in ([frame([], columns), getattr(e, name)], [getattr(e, name), frame([], columns)]):
                _same(*_declared(concat(parts), _pandas_concat(parts)))


def test_aggregated_is_pandas_named_aggregation(extractions):
    for e in extractions.values():
        x = e.exchanges.assign(client_text=e.exchanges["client"].astype(object))
        for keys, dropna in ((["capture", "conn_index"], True), ("client_text", False), ("conn_id", False)):
            named = {"n": ("seq", "size"), "bytes": ("bytes_resp", "sum"), "first_seq": ("seq", "min"),
                     "last_seq": ("seq", "max"), "response_s": ("response_s", "mean"),
                     "slowest_s": ("response_s", "max"), "sql": ("sql", "first"), "conn_id": ("conn_id", "first")}
            grouped = x.groupby(keys, dropna=dropna, observed=True)
            _same(aggregated(grouped, **named), grouped.agg(**named))


def test_a_file_is_written_as_pyarrow_describes_each_frame_whatever_was_written_before(tmp_path, extractions):
    """The Parquet writer keeps the schemas it made per frame signature: each file still holds the schema and
    pandas metadata pyarrow gives the frame (text as plain strings), and reads back as the frame, also when a frame
    of the same columns but wider category codes (more than 127 distinct texts) comes after."""
    x = extractions[CAPTURES / "oltp-prepared" / "db.pcap"].exchanges
    narrow = x.assign(sql=pd.Series(["SELECT 1"] * len(x), dtype="category"))
    wide = x.assign(sql=pd.Series([f"SELECT {i}" for i in range(len(x))], dtype="category"))
    assert len(wide["sql"].cat.categories) > 127 and wide["sql"].cat.codes.dtype != narrow["sql"].cat.codes.dtype
    for i, df in enumerate([narrow, wide, narrow, wide]):
        path = tmp_path / f"t{i}.parquet"
        outputs.write_table(df, path)
        text = [c for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)]
        # as pyarrow describes the frame in its declared dtypes (whole numbers held in int32 are written as int64)
        described = pa.Schema.from_pandas(as_declared(df.iloc[:0]).astype({c: "string" for c in text}),
                                          preserve_index=False)
        assert pq.read_schema(path).equals(described, check_metadata=True)
        back = pd.read_parquet(path)
        pd.testing.assert_frame_equal(back, df.astype({c: "str" for c in text}), check_exact=True, check_dtype=False)
    assert (tmp_path / "t0.parquet").read_bytes() == (tmp_path / "t2.parquet").read_bytes()
    assert (tmp_path / "t1.parquet").read_bytes() == (tmp_path / "t3.parquet").read_bytes()


def test_the_page_written_in_parts_is_the_page_as_one_string(tmp_path):
    import plotly.offline

    from pcapdecomp.render.report import Page, write_page

    page = Page("<!doctype html><title>ü — x</title><script>", "</script><p>\u2028 ✓</p>\n")
    write_page(tmp_path / "a.html", page)
    write_page(tmp_path / "b.html", page.text())
    whole = "<!doctype html><title>ü — x</title><script>" + plotly.offline.get_plotlyjs() + "</script><p>\u2028 ✓</p>\n"
    assert page.text() == whole
    assert (tmp_path / "a.html").read_bytes() == (tmp_path / "b.html").read_bytes() == whole.encode("utf-8")


def test_a_mistake_in_the_capture_set_is_refused_before_pandas_is_imported(tmp_path):
    code = ("import sys\nfrom pcapdecomp.cli import main\nsys.argv = ['pcapdecomp', *sys.argv[1:]]\n"
            "try:\n    main()\nfinally:\n    print('pandas' in sys.modules, 'pyarrow' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code, "analyze", str(tmp_path / "missing")], capture_output=True,
                          text=True, cwd=REPO, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"pcapdecomp: error: {tmp_path / 'missing'}: no such folder"
    assert proc.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("alone", ["db", "app"])
def test_the_matching_of_one_point_alone_is_the_pairing_of_an_empty_other_point(extractions, alone):
    """A capture at one point only is not paired (match.one_point_matching): its Matching is what the whole
    pairing gives against an empty table at the other point, array for array, note for note, count for count."""
    from pcapdecomp.core.schema import CONNECTION_COLUMNS as CONNS
    from pcapdecomp.core.tables import frame
    from pcapdecomp.pair.match import Pairing, one_point_matching

    empty, empty_conns = frame([], EXCHANGE_COLUMNS), frame([], CONNS)
    checked = 0
    for x in extractions.values():
        ex, conns = x.exchanges, x.connections
        app, db, app_conns, db_conns = (empty, ex, empty_conns, conns) if alone == "db" else (ex, empty, conns, empty_conns)
        want, got = Pairing(app, db, app_conns, db_conns).complete(), one_point_matching(app, db)
        for name in ("app_row", "db_row", "notes"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
        pd.testing.assert_frame_equal(got.connections, want.connections, check_exact=True)
        assert got.stats == want.stats
        checked += len(ex)
    assert checked > 1000
    with pytest.raises(ValueError):
        one_point_matching(ex, ex)


def test_a_list_of_text_becomes_the_categorical_pandas_makes_of_it(extractions):
    """as_category of a list of texts and nulls (taken as an array of objects, hashed once) is the categorical
    pandas makes of those values as text, with their distinct values sorted as its categories."""
    from pcapdecomp.core.tables import as_category

    def pandas_own(values):
        text = pd.Series(values, dtype="string")
        return pd.Series(pd.Categorical(text, categories=pd.Index(sorted(text.dropna().unique()), dtype="str")))

    lists = [[], [None], ["db.pcap"] * 3, ["b", None, "a", "é", "", "b"]]
    lists += [e.exchanges["sql"].astype(object).where(e.exchanges["sql"].notna(), None).tolist()
              for e in extractions.values()]
    for values in lists:
        got, want = as_category(values), pandas_own(values)
        pd.testing.assert_series_equal(got, want, check_exact=True)
        assert got.cat.codes.dtype == want.cat.codes.dtype


def test_tables_of_no_rows_are_each_their_own(extractions):
    """frame([], columns) is made once per declaration: what one caller does to its table is not in the next."""
    from pcapdecomp.core.tables import batch, frame, frame_of

    made = frame_of([batch([], EXCHANGE_COLUMNS)], EXCHANGE_COLUMNS)
    first = frame([], EXCHANGE_COLUMNS)
    _same(first, made)
    first["seq"] = first["seq"] + 1
    del first["sql"]
    first["added"] = []
    _same(frame([], EXCHANGE_COLUMNS), made)


def test_a_short_table_is_written_as_pyarrows_conversion_of_the_frame_writes_it(tmp_path, extractions, monkeypatch):
    """A row group of few rows per column is converted column by column (pa.array, as pa.Table.from_pandas calls
    it, without the description it makes): the file is byte for byte the one written through from_pandas."""
    written = 0
    for i, e in enumerate(extractions.values()):
        for name, table in (("x", e.exchanges), ("c", e.connections)):
            short, whole = tmp_path / f"{name}{i}-short.parquet", tmp_path / f"{name}{i}-whole.parquet"
            monkeypatch.setattr(outputs, "THREADED_ROWS_PER_COLUMN", 10 ** 9)
            outputs.write_table(table, short)
            monkeypatch.setattr(outputs, "THREADED_ROWS_PER_COLUMN", 0)
            outputs.write_table(table, whole)
            assert short.read_bytes() == whole.read_bytes(), short.name
            written += len(table)
    assert written > 1000
