"""capture.toml is read and checked from its one declaration (core/schema.py CAPTURE_TOML_KEYS): the files the lab
and `pcapdecomp guide` write pass it without a word, a key it does not declare is named in one warning, a value of
the wrong type is one line and exit code 2 before any capture is read."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from pcapdecomp.core.errors import InputError
from pcapdecomp.core.schema import CAPTURE_TOML_KEYS, INPUT_TYPES, TABLES
from pcapdecomp.guide import GuideOptions, capture_toml
from pcapdecomp.read.captureset import resolve_capture_set

REPO = Path(__file__).resolve().parents[1]
SETS = sorted(p.parent for p in (REPO / "captures").glob("*/capture.toml"))
GROUP_STALL = REPO / "captures" / "group-stall"


def _set_with(tmp_path: Path, edit) -> Path:
    """group-stall's capture set with its capture.toml edited by `edit(text) -> text`."""
    folder = tmp_path / "set"
    folder.mkdir()
    for name in ("db.pcap", "slow.log"):
        shutil.copyfile(GROUP_STALL / name, folder / name)
    (folder / "capture.toml").write_text(edit((GROUP_STALL / "capture.toml").read_text()))
    return folder


def _resolved(folder: Path):
    return resolve_capture_set(folder, [], None, None, None, None, [])


def test_the_declaration_is_one_of_the_printed_tables():
    assert TABLES["capture-toml"] is CAPTURE_TOML_KEYS
    assert all(k.dtype in INPUT_TYPES and k.meaning for k in CAPTURE_TOML_KEYS)
    assert len({k.name for k in CAPTURE_TOML_KEYS}) == len(CAPTURE_TOML_KEYS)


@pytest.mark.parametrize("folder", SETS, ids=[p.name for p in SETS])
def test_every_bundled_capture_toml_passes_without_a_warning(folder):
    assert len(SETS) >= 20
    assert not [w for w in _resolved(folder).warnings if "capture.toml" in w and "not read" in w]


def test_the_guides_capture_toml_passes_and_every_key_it_writes_is_declared(tmp_path):
    opts = GuideOptions(server="10.0.0.5:3306", out=tmp_path / "set", app_hosts=["10.0.0.7", "10.0.0.8"],
                        long_query_time=0.5, thread_pool_size=4)
    text = capture_toml(opts)
    written = tomllib.loads(text)
    assert written["app"]["addresses"] == ["10.0.0.7", "10.0.0.8"]
    folder = _set_with(tmp_path, lambda _: text)
    cs = _resolved(folder)
    assert cs.long_query_time == 0.5 and cs.thread_pool_size == 4 and cs.servers == ["10.0.0.5:3306"]
    assert not [w for w in cs.warnings if "not read" in w]


def test_an_unknown_key_is_named_in_one_warning_and_the_rest_is_read(tmp_path):
    folder = _set_with(tmp_path, lambda t: t.replace("long_query_time =", "long_query_tme =")
                       + "\n[extra]\nwhatever = 1\n")
    cs = _resolved(folder)
    lines = [w for w in cs.warnings if "not read" in w]
    assert len(lines) == 1 and "[server] long_query_tme" in lines[0] and "extra" in lines[0], cs.warnings
    assert cs.long_query_time is None  # the misspelt key was not taken for long_query_time
    assert cs.thread_pool_size == tomllib.loads((GROUP_STALL / "capture.toml").read_text())["server"]["thread_pool_size"]


def test_a_rotated_sets_packet_counts_per_point_are_declared(tmp_path):
    folder = _set_with(tmp_path, lambda t: t.replace("[captures]", "[captures]\ndb2_packets = 12\nreplica_packets = 3"))
    assert not [w for w in _resolved(folder).warnings if "not read" in w]


WRONG = [  # (the bundled line's start, the line instead, the message)
    ("tls = ", "tls = \"yes\"", "[server] tls must be true or false"),
    ("thread_pool_stall_limit = ", "thread_pool_stall_limit = \"10ms\"  #", "[server] thread_pool_stall_limit must be a number"),
    ("long_query_time = ", "long_query_time = true  #", "[server] long_query_time must be a number"),
    ("address = ", "address = \"db:3306\"  #", "[server] address must be \"IP:PORT\""),
    ("slow_log = ", "slow_log = 5  #", "[captures] slow_log must be a file name or a list of file names"),
]


@pytest.mark.parametrize("prefix,replacement,message", WRONG, ids=[w[2].split(" must")[0] for w in WRONG])
def test_a_value_of_the_wrong_type_is_a_mistake(tmp_path, prefix, replacement, message):
    lines = (GROUP_STALL / "capture.toml").read_text().splitlines()
    assert any(line.startswith(prefix) for line in lines), prefix  # the bundled file has the key
    folder = _set_with(tmp_path, lambda t: "\n".join(replacement if line.startswith(prefix) else line
                                                   for line in t.splitlines()) + "\n")
    with pytest.raises(InputError, match=re.escape(message)):
        _resolved(folder)


def test_a_wrong_type_is_one_line_and_exit_2_before_any_capture_is_read(tmp_path):
    folder = _set_with(tmp_path, lambda t: t.replace("tls = false", "tls = \"no\""))
    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(folder), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "[server] tls must be true or false, got 'no'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_captures_it_names_that_are_not_there_are_named_when_nothing_is_left(tmp_path):
    # the recording's capture.toml copied beside a rotated file of another name: its [captures] names app.pcap and
    # db.pcap, so the folder's own files are not looked for, and the one line says which names were not found
    from pcapdecomp.core.errors import UsageError

    folder = _set_with(tmp_path, lambda text: text)
    (folder / "db.pcap").rename(folder / "db_00000_20261127100003.pcap")
    with pytest.raises(UsageError, match=re.escape("[captures] names app = 'app.pcap', db = 'db.pcap', which are not there")):
        _resolved(folder)
