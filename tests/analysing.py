"""`analyze` as the tests call it, from one set of keywords (the capture set from a folder and/or named files, the
options, the output folder): `analyse` runs the whole spine and writes the outputs; `explain` calls the stages'
faces only (read.extract → pair.pairing → explain.servers, and the summary they make), as the spine does with
--jobs 1 but writing nothing: a test of what a stage found needs no Parquet files and no report."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pcapdecomp.analysis import AnalysisResult, Options, analyze, capture_set
from pcapdecomp.core.tables import as_declared
from pcapdecomp.explain.servers import Explained, explain_servers, summary_of
from pcapdecomp.pair.pairing import Paired, pair_points
from pcapdecomp.read.captureset import CaptureSet, time_zone
from pcapdecomp.read.extract import Extracted, extract_points

# capture_set's keywords (the folder is the first argument): the rest of a call's keywords are Options'
CAPTURE_SET_KEYS = set(inspect.signature(capture_set).parameters) - {"folder"}


def _split(set_dir: Path | CaptureSet | None, kw: dict) -> tuple[CaptureSet, Options]:
    given = {k: v for k, v in kw.items() if k in CAPTURE_SET_KEYS}
    options = Options(**{"quiet": True, **{k: v for k, v in kw.items() if k not in CAPTURE_SET_KEYS}})
    cs = set_dir if isinstance(set_dir, CaptureSet) else capture_set(set_dir, **given)
    return cs, options


def analyse(set_dir: Path | None, out: Path, **kw) -> AnalysisResult:
    """analyze of the capture set `set_dir` and/or the files `kw` names, with `kw`'s other keys as Options (quiet
    unless told)."""
    cs, options = _split(set_dir, kw)
    return analyze(cs, options, out)


@dataclass
class Stages:
    """The stages' results of one capture set: what `analyze` would write, without writing it."""

    cs: CaptureSet
    extracted: Extracted
    paired: Paired
    explained: Explained
    summary: dict  # summary.json's content
    warnings: list[str]

    @functools.cached_property
    def exchanges(self) -> pd.DataFrame:  # exchanges.parquet's table: in its declared dtypes (the run held it narrower)
        return as_declared(self.explained.exchanges)

    @property
    def groups(self) -> pd.DataFrame:  # groups.parquet's table
        return self.explained.groups


def explain(set_dir: Path | CaptureSet | None = None, **kw) -> Stages:
    """The three stage faces and the summary of the capture set `set_dir` (a folder or a CaptureSet) and/or the
    files `kw` names, in one process (Options' jobs and max_sql_bytes and slow_log_tz are honoured; quiet)."""
    cs, options = _split(set_dir, kw)
    warnings = list(cs.warnings)
    jobs = options.jobs or 1
    extracted = extract_points(cs, jobs, True, options.max_sql_bytes, warnings.append)
    paired = pair_points(extracted, cs, jobs, options.max_sql_bytes, warnings.append)
    explained = explain_servers(paired, cs, [x.capture for x in extracted.db], time_zone(options.slow_log_tz),
                                options.max_sql_bytes, warnings.append)
    summary = summary_of(cs, extracted, paired, explained, warnings)
    return Stages(cs, extracted, paired, explained, summary, warnings)
