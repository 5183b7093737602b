"""`analyze` as the tests call it: the capture set from a folder and/or named files, the options, the output
folder, from one set of keywords."""

from __future__ import annotations

import inspect
from pathlib import Path

from pcapdecomp.analysis import AnalysisResult, Options, analyze, capture_set

# capture_set's keywords (the folder is the first argument): the rest of a call's keywords are Options'
CAPTURE_SET_KEYS = set(inspect.signature(capture_set).parameters) - {"folder"}


def analyse(set_dir: Path | None, out: Path, **kw) -> AnalysisResult:
    """analyze of the capture set `set_dir` and/or the files `kw` names, with `kw`'s other keys as Options (quiet
    unless told)."""
    given = {k: v for k, v in kw.items() if k in CAPTURE_SET_KEYS}
    options = Options(**{"quiet": True, **{k: v for k, v in kw.items() if k not in CAPTURE_SET_KEYS}})
    return analyze(capture_set(set_dir, **given), options, out)
