"""The CLI's start-up shortcuts reach into private APIs (cli._plain_values_without_pydantic: typer's value
conversion; cli._exit_functions: CPython's atexit._run_exitfuncs before os._exit). Each must only make the CLI
faster: where it cannot apply (a typer that moved or changed what it patches, an interpreter without the atexit
function), the same commands give the same outputs, exit codes and messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "captures" / "group-stall" / "db.pcap"

# What each child does before the CLI runs: nothing, or make one shortcut unable to apply. A typer that changed is
# shown to the layer alone: typer's own functions keep the module globals they were made with.
_PROXY = ("import types, typer, typer._adapters\n"
          "def proxy(name, **changes):\n"
          "    module = types.ModuleType(name)\n"
          "    module.__dict__.update(vars(sys.modules[name]))\n"
          "    for key, value in changes.items():\n"
          "        if value is None:\n"
          "            del module.__dict__[key]\n"
          "        else:\n"
          "            module.__dict__[key] = value\n"
          "    sys.modules[name] = module\n")
PRELUDES = {
    "as shipped": "",
    "typer without the names the layer takes": _PROXY + "proxy('typer._coercion', PassThroughRuntimeParam=None)\n",
    "typer's path check changed": _PROXY + (
        "def changed(*args, **kwargs):\n"
        "    raise TypeError('coerce_cli_path() got an unexpected keyword argument')\n"
        "proxy('typer._param_types', coerce_cli_path=changed)\n"),
    "typer's runtime parameters changed": _PROXY + (
        "import dataclasses, typer._coercion as c\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class Changed(c.PassThroughRuntimeParam):\n"
        "    a_new_field: int\n"
        "proxy('typer._coercion', PassThroughRuntimeParam=Changed)\n"),
    "no atexit._run_exitfuncs": "import atexit\ndel atexit._run_exitfuncs\n",
}


def _run(prelude: str, args: list[str]) -> subprocess.CompletedProcess:
    """The CLI with `args` in a child Python that runs `prelude` first and, as it ends, prints HANDLER RAN from an
    atexit handler (a normal end runs it; so must the early end), and whether pydantic was imported."""
    probe = ("import atexit, runpy, sys\n" + prelude
             + "atexit.register(lambda: print('HANDLER RAN; pydantic', 'pydantic' in sys.modules, file=sys.stderr))\n"
             f"sys.argv = ['pcapdecomp', *{args!r}]\n"
             "runpy.run_module('pcapdecomp.cli', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    out = tmp_path_factory.mktemp("shipped") / "x.parquet"
    return _run("", ["exchanges", str(CAPTURE), "--out", str(out)]), out


@pytest.mark.parametrize("name", list(PRELUDES))
def test_exchanges_gives_the_same_outputs_whether_the_shortcuts_apply_or_not(name, shipped, tmp_path):
    want, want_file = shipped
    assert want.returncode == 0 and "HANDLER RAN" in want.stderr, want.stderr[-500:]
    out = tmp_path / "x.parquet"
    got = _run(PRELUDES[name], ["exchanges", str(CAPTURE), "--out", str(out)])
    assert got.returncode == 0, got.stderr[-500:]
    assert "HANDLER RAN" in got.stderr  # the registered handlers ran, however the process ended
    # typer's own conversion (pydantic) took the values exactly where the layer could not apply
    assert ("pydantic True" in got.stderr) == name.startswith("typer"), got.stderr[-300:]
    assert got.stdout == want.stdout and len(got.stdout.splitlines()) > 3
    pd.testing.assert_frame_equal(pd.read_parquet(out), pd.read_parquet(want_file), check_exact=True)


MISTAKES = [  # (arguments, what the one line says): typer's own conversion words these
    (["exchanges", str(CAPTURE), "--jobs", "0"], "--jobs"),
    (["exchanges", str(CAPTURE), "--max-sql-bytes", "ten"], "--max-sql-bytes"),
    (["exchanges", str(REPO / "no-such.pcap")], "no-such.pcap"),
    (["analyze", "--db", str(CAPTURE), "--long-query-time", "soon"], "--long-query-time"),
]


@pytest.fixture(scope="module")
def shipped_mistakes() -> list[subprocess.CompletedProcess]:
    """Each mistake as the CLI ships, run once for all the preludes compared with it."""
    return [_run("", args) for args, _ in MISTAKES]


@pytest.mark.parametrize("name", [n for n in PRELUDES if n != "no atexit._run_exitfuncs"])
def test_a_mistaken_value_is_worded_the_same_whether_the_layer_applies_or_not(name, shipped_mistakes):
    for (args, words), want in zip(MISTAKES, shipped_mistakes):
        got = _run(PRELUDES[name], args)
        assert want.returncode == got.returncode == 2, (args, want.stderr[-300:], got.stderr[-300:])
        message = [line for line in got.stderr.splitlines() if not line.startswith("HANDLER RAN")]
        assert words in got.stderr and message == [line for line in want.stderr.splitlines()
                                                   if not line.startswith("HANDLER RAN")], args
        assert "Traceback" not in got.stderr


@pytest.mark.parametrize("value", ["0.25", "1", "007.500"])
def test_a_decimal_number_is_taken_as_typers_own_conversion_takes_it(value, tmp_path):
    """--long-query-time (a float) converted by the layer, without pydantic, is the number typer's own conversion
    makes of the same text: the same summary.json."""
    import json

    summaries = {}
    for name in ("as shipped", "typer without the names the layer takes"):
        out = tmp_path / name.replace(" ", "-")
        got = _run(PRELUDES[name], ["analyze", "--db", str(CAPTURE), "--long-query-time", value, "-q", "-o", str(out)])
        assert got.returncode == 0, got.stderr[-500:]
        assert ("pydantic True" in got.stderr) == (name != "as shipped"), got.stderr[-300:]
        summary = json.loads((out / "summary.json").read_text())
        summary["inputs"].pop("cwd", None)
        summaries[name] = summary
    shipped, typers = summaries.values()
    assert shipped["inputs"]["long_query_time"] == float(value) and type(shipped["inputs"]["long_query_time"]) is float
    assert shipped == typers
