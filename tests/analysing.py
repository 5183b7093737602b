"""`analyze` as the tests call it: the capture set from a folder and/or named files, the options, the output
folder, from one set of keywords."""

from __future__ import annotations

from pathlib import Path

from pcapdecomp.analysis import AnalysisResult, Options, analyze, capture_set

CAPTURE_SET_KEYS = {"app", "db", "slow_log", "long_query_time", "thread_pool_size", "servers", "proxy",
                    "proxy_servers", "processlist", "tls_keylog", "server_settings"}


def analyse(set_dir: Path | None, out: Path, **kw) -> AnalysisResult:
    """analyze of the capture set `set_dir` and/or the files `kw` names, with `kw`'s other keys as Options (quiet
    unless told)."""
    given = {k: v for k, v in kw.items() if k in CAPTURE_SET_KEYS}
    options = Options(**{"quiet": True, **{k: v for k, v in kw.items() if k not in CAPTURE_SET_KEYS}})
    return analyze(capture_set(set_dir, **given), options, out)
