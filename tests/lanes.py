"""The native fast lane against its Python twin, for tests: `extract_with(path, lane)` extracts with or without
the lane (PCAPDECOMP_NO_LANE), `assert_same(path)` extracts both ways and asserts everything an extraction holds is
equal."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pandas as pd

from pcapdecomp.read.exchanges import extract


def extract_with(path: Path, lane: bool, **kw):
    old = os.environ.pop("PCAPDECOMP_NO_LANE", None)
    if not lane:
        os.environ["PCAPDECOMP_NO_LANE"] = "1"
    try:
        return extract(path, **kw)
    finally:
        os.environ.pop("PCAPDECOMP_NO_LANE", None)
        if old is not None:
            os.environ["PCAPDECOMP_NO_LANE"] = old


def assert_same(path: Path, native=None, **kw):
    """Extract with Python alone and with the lane; everything an extraction holds must be equal. Returns the
    lane's extraction. `native`: the lane's extraction of `path` with `kw` where the caller has it already."""
    python = extract_with(path, False, **kw)
    native = native if native is not None else extract_with(path, True, **kw)
    # exact: the two lanes give the same values, floats to the last bit; and pandas compares a categorical column
    # value by value in Python unless told to compare exactly (its codes and categories)
    pd.testing.assert_frame_equal(python.exchanges, native.exchanges, check_exact=True)
    pd.testing.assert_frame_equal(python.connections, native.connections, check_exact=True)
    assert dataclasses.asdict(python.stats) == dataclasses.asdict(native.stats)
    assert python.quality() == native.quality()
    assert python.commands == native.commands
    assert (python.other_tcp_frames, python.other_tcp_bytes) == (native.other_tcp_frames, native.other_tcp_bytes)
    assert python.flow_first_frames == native.flow_first_frames
    assert python.native_frames == 0
    return native
