"""`pcapdecomp analyze`, the spine: a capture set → its capture points read (read.extract) → paired, repaired and
their clocks fitted (pair.pairing) → the slow log joined and each exchange's latency decomposed per DB server, the
thread-pool view (explain.servers) → summary.json with its verdict, report.html and the tables, written as one set
(run.session). Each stage is one call with a typed result; how they run (processes, Dask, the output folder,
memory between stages) is run.session's."""

from __future__ import annotations

from pathlib import Path

from .explain.servers import explain_servers
from .pair.pairing import pair_points
from .read.captureset import CaptureSet, capture_set
from .read.extract import extract_points
from .run.session import AnalysisResult, Options, Run
from .run.spilled import (PartitionedInstead, analyze_spilled, in_memory_fits, refusal, spill_first, spill_folder,
                          spill_instead)

__all__ = ["AnalysisResult", "CaptureSet", "Options", "analyze", "capture_set"]


def analyze(cs: CaptureSet | Path, options: Options = Options(), out: Path | None = None) -> AnalysisResult:
    """Run every stage on `cs` (a capture set, or a capture-set folder) and write the outputs to `out` (default
    reports/<the set's name>). Raises PcapdecompError subclasses for user mistakes."""
    if not isinstance(cs, CaptureSet):
        cs = capture_set(Path(cs))
    with Run(cs, options, out) as run:
        o = run.options
        spill = over = None
        if o.spill is not None:  # --spill: the run's folder in DIR, None when the set is analysed in memory (said)
            spill = spill_folder(run, cs)
        # a bound the set may not fit in memory: its rows spilled as read (here or on --scheduler's workers), the
        # bound asked before a table is held whole
        first = spill_first(run, cs) if o.spill is None else None
        # spilled, the captures are read on a --scheduler's workers when they share the spill folder, else here
        noted = len(run.warnings)
        try:
            extracted = extract_points(cs, run.jobs, o.quiet, o.max_sql_bytes, run.note,
                                       run.runner if spill is None and first is None else run.spill_runner,
                                       run.memory if first is None else None, spill=spill or first,
                                       spill_hint=o.spill is None and refusal(cs, o.csv, o.partitioned) is None)
        except PartitionedInstead as err:  # too big for the bound in memory, not partitioned: unless --in-memory,
            if o.in_memory:  # read again into partitions (its traceback, and what the extraction held, let go)
                raise
            over = err.with_traceback(None)
        if over is not None:
            spill = spill_instead(run, cs, over, noted)
            extracted = extract_points(cs, run.jobs, o.quiet, o.max_sql_bytes, run.note, run.spill_runner,
                                       run.memory, spill=spill)
        elif first is not None and not in_memory_fits(run, cs, extracted):
            spill = first
        if spill is not None:  # the partitioned run (None: not partitionable after all, said: in memory)
            done = analyze_spilled(run, cs, extracted, spill)
            if done is not None:
                return done
        paired = pair_points(extracted, cs, run.jobs, o.max_sql_bytes, run.note, run.runner, run.ahead, run.lean,
                             loss_repair=o.loss_repair)
        explained = explain_servers(paired, cs, [x.capture for x in extracted.db], run.tz, o.max_sql_bytes,
                                    run.note, run.beside_the_view())
        return run.finish(extracted, paired, explained)
