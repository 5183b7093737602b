"""One run of `analyze` as processes and files: the output folder written as one set (core.outputs.OutputFolder;
a bug becomes one line, its traceback a file in it), the Dask runner of --scheduler, the workers that start the
clock's pass ahead, the warnings, the memory between stages, and the last step: summary.json, report.html and the
tables, written beside each other by forked children with --jobs N, one after the other with --jobs 1."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..core.console import warn
from ..core.errors import InputError, UsageError, internal_errors_to
from ..core.memory import MemoryBound, beyond_the_machine, map_big_blocks, parse_size, release_memory
from ..core.outputs import OutputFolder, write_table, write_text
from ..core.schema import ANALYSIS_COLUMNS, EXCHANGE_COLUMNS
from ..core.tables import as_declared, with_declared_dtypes
from ..core.workers import Ahead, Forked, default_jobs
from ..explain.servers import Explained, summary_of
from ..explain.summary import latency_quantiles
from ..explain.summary import to_json as summary_json
from ..pair.pairing import Paired
from ..read import extract
from ..read.captureset import CaptureSet, time_zone
from ..read.extract import Extracted
from ..render.report import component_rows
from ..render.report import render_page
from ..render.report import unspanned_profile, write_page

ANALYSIS_NAMES = ("exchanges.parquet", "groups.parquet", "pool.parquet", "summary.json", "report.html")  # always
DATASET_NAME = "exchanges"  # --partitioned: the hive-style dataset folder in the output folder


@dataclass(frozen=True)
class Options:
    """How to run `analyze` (the capture set says what to analyse)."""

    jobs: int | None = None  # worker processes; None: the cores available, at most 8 (one for a small set: _small)
    quiet: bool = False  # no progress, no warnings on the terminal
    csv: bool = False  # exchanges.csv beside exchanges.parquet
    partitioned: bool = False  # exchanges/ as a hive-style dataset too
    slow_log_tz: str | None = None  # the slow log's time zone (an IANA name); None: UTC
    max_sql_bytes: int = 1 << 20  # SQL text kept per statement
    scheduler: str | None = None  # a Dask scheduler's address, or "local"
    scheduler_tls: str | None = None  # "CA,CERT,KEY" for a tls:// scheduler
    command_line: str | None = None  # as the report shows it
    memory: str | None = None  # the process tree's memory bound (8G, 800M…); None: capture.toml's, else the default
    spill: Path | None = None  # --spill DIR: the partitioned run, its partitions in a folder of its own in DIR
    in_memory: bool = False  # never partitioned without --spill: a set too big for the bound in memory is refused
    # internal, for tests (no command-line option): False analyses a pair that lost frames without the loss repair,
    # its lost bytes left holes, as the partitioned run does when the repair would not fit the bound (docs/scale.md)
    loss_repair: bool = True


@dataclass
class AnalysisResult:
    out_dir: Path
    held_exchanges: pd.DataFrame = field(repr=False)  # the table as the run held it (core.tables.held)
    groups: pd.DataFrame  # per thread group and time bucket
    summary: dict  # what summary.json holds
    written: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @functools.cached_property
    def exchanges(self) -> pd.DataFrame:
        """EXCHANGE_COLUMNS + ANALYSIS_COLUMNS in their declared dtypes, as exchanges.parquet has them: made when
        first asked for (the command line never asks: widened as the run ends, the table would take its full
        width again then)."""
        return as_declared(self.held_exchanges)


class Run:
    """A context around the stages of one analysis. Checks the options and the output folder and connects to the
    Dask scheduler (a wrong address fails here, before any work); inside, `note` collects the warnings, `ahead` has
    the workers for the clock's pass, `finish` writes the outputs and commits the folder."""

    def __init__(self, cs: CaptureSet, options: Options, out: Path | None):
        self.cs = cs
        self.options = options
        self.tz = time_zone(options.slow_log_tz)
        self.jobs = options.jobs if options.jobs is not None else 1 if options.scheduler is None and _small(cs) \
            else default_jobs()
        if self.jobs < 1:
            raise UsageError(f"--jobs must be ≥ 1, got {self.jobs}")
        # the bound is stated before any work, and a bound no analysis fits in is refused here
        given, where = ((options.memory, "--memory") if options.memory is not None else
                        (cs.memory, "capture.toml: memory =") if cs.memory is not None else (None, None))
        self.memory = MemoryBound(None if given is None else parse_size(given, where),
                                  None if given is None else f"{where} {given}", self.jobs)
        self.memory.check_start()
        self.out = out if out is not None else Path("reports") / cs.name
        if self.out.exists() and not self.out.is_dir():
            raise InputError(f"{self.out}: exists and is not a folder")
        self.warnings: list[str] = []
        self._taken_back: set[str] = set()  # warnings printed, then taken back (take_back_warnings)
        if given is not None:  # a bound the machine cannot give is no bound: said, not silently accepted
            beyond = beyond_the_machine(self.memory.limit, self.memory.start, self.memory.source)
            if beyond is not None:
                self.note(beyond)
        self.runner = None
        self.spill_runner = None  # with --spill: the runner whose workers share the spill folder (run.spilled)
        # partitioned instead (run.spilled.spill_instead): the partitions' folder is the run's own choice in the output
        # folder, no --spill given; its end and its messages are said as such
        self.spill_automatic = False
        self._beside: list[Forked] = []  # the child that makes what the report reads of the decomposition alone

    @property
    def lean(self) -> bool:
        """--jobs 1 puts memory before time: until the loss repair is done, a freed array of 1 MiB or more goes back
        to the OS at once, as the extraction's arrays and the repair's scan come and go beside the tables. With a
        --scheduler, only when the run is partitioned (--spill, or partitioned instead: then the client holds the
        spill's counts alone); asked again once that is known, so a run partitioned instead is lean in its late
        stage as one given --spill is."""
        partitioned = self.options.spill is not None or self.spill_automatic
        return self.jobs == 1 and (self.options.scheduler is None or partitioned)

    def __enter__(self) -> Run:
        if self.options.scheduler is not None:
            from .cluster import DaskRunner

            self.runner = DaskRunner.connect(self.options.scheduler, self.cs.points, self.options.quiet, self.jobs,
                                             tls=self.options.scheduler_tls)
            if self.memory is not None and self.runner.cluster is not None:  # a LocalCluster: this tree's
                self.runner.warm()
                self.memory.count_children()
                self.memory.check_start()
        self._stack = ExitStack()
        try:
            if self.runner is not None:
                self._stack.callback(self.runner.close)
            self._stack.enter_context(internal_errors_to(self.out))
            # the folder's exit on the stack before its __enter__ makes the staging folder (its exit is a no-op for
            # what was not made): with enter_context, a Ctrl-C taken between that __enter__ returning and the exit
            # being pushed was in neither
            folder = OutputFolder(self.out, ANALYSIS_NAMES)
            self._stack.push(folder)
            self.folder = folder.__enter__()
            self.ahead = self._stack.enter_context(Ahead(self.jobs if self.runner is None else 1))
            self.children = self._stack.enter_context(ExitStack())  # forked children; they end before the commit
            for message in self.cs.warnings:
                self.note(message)
            if self.lean:
                map_big_blocks(1 << 20)  # until the repair is done (pair.pairing.pair_points ends it)
        except BaseException:
            # the exits told of the failure (close() tells them of none: the output folder this run made stayed, as
            # a success would keep it); and everything up to the return inside the try: a Ctrl-C taken after it,
            # before `with` holds this context, never reached the stack (the staging folder stayed)
            if not self._stack.__exit__(*sys.exc_info()):
                raise
        return self

    def __exit__(self, *exc) -> bool:
        return self._stack.__exit__(*exc)

    def at_exit(self, callback: Callable[[], None]) -> None:
        """`callback()` when the run ends, whatever the end (before the output folder's own exit)."""
        self._stack.callback(callback)

    def within(self, context) -> None:
        """`context` entered now and left when the run ends (before the output folder's own exit): its exit sees
        the run's exception and may say it another way."""
        self._stack.enter_context(context)

    def note(self, message: str) -> None:
        """A warning: into summary.json, and on the terminal unless --quiet (once: one taken back and said again by
        the extraction done again is not printed twice)."""
        self.warnings.append(message)
        if not self.options.quiet and message not in self._taken_back:
            warn(message)

    def take_back_warnings(self, since: int) -> None:
        """Forget the warnings from the `since`-th on: they were an extraction's that is thrown away and done again
        (the in-memory extraction over the bound, read again partitioned: run.spilled.spill_instead), which says them
        again; kept, summary.json would hold them twice. Already on the terminal: when said again, not printed again
        (a lossy capture's damage line came twice)."""
        self._taken_back.update(self.warnings[since:])
        del self.warnings[since:]

    def beside_the_view(self) -> Callable[[pd.DataFrame], None] | None:
        """With --jobs N: a hook that forks a child making what the summary and the report read of the
        decomposition alone (_beside_the_view), while this process makes the thread-pool view."""
        if self.jobs <= 1:
            return None

        def start(decomposed: pd.DataFrame) -> None:
            self._beside.append(self.children.enter_context(Forked(_beside_the_view, decomposed)))
        return start

    def finish(self, x: Extracted, paired: Paired, explained: Explained) -> AnalysisResult:
        """The last step: summary.json with its verdict (explain.servers.summary_of), report.html (render.report.render_page)
        and the tables, into the output folder, committed as one set."""
        cs, options, out = self.cs, self.options, self.folder.staging
        exchanges, groups, pool = explained.exchanges, explained.groups, explained.pool
        first = explained.servers[0]
        conns = {"app": paired.app_conns, "db": paired.db_conns}
        scheduler = self.runner.address if self.runner is not None else None

        def summarised(latency: dict | None = None) -> dict:
            return summary_of(cs, x, paired, explained, self.warnings, scheduler, latency)

        # With --jobs N the tables are written by a forked child as soon as they are whole, while the summary is
        # built and the report renders here: it shares the tables as they are (nothing pickled), and converting them
        # to Arrow holds the GIL, so a thread here would not run beside them. The query profile (the report's most
        # costly part) comes from a second child: the one started beside the thread-pool view (beside_the_view), or
        # one started now. --jobs 1: one after the other.
        if self.jobs > 1:
            early = self._beside
            with (Forked(_write_tables, out, cs, exchanges, groups, pool, options.csv, options.partitioned) as writing,
                  nullcontext() if early else Forked(unspanned_profile, exchanges) as profiling):
                beside = early[0].result() if early else {}
                summary = summarised(beside.get("latency"))
                page = render_page(summary, exchanges, first.view.groups, options.command_line, conns,
                                   first.view.pool,
                                   (lambda: beside["profile"]) if early else profiling.result,
                                   (lambda: beside["components"]) if early else None)
                del beside
                names = writing.result()
            names.append(_write_summary(out, summary))
        else:
            summary = summarised()
            names = _write_outputs(out, cs, exchanges, groups, pool, summary, options.csv, options.partitioned)
            page = render_page(summary, exchanges, first.view.groups, options.command_line, conns, first.view.pool)
        names.append("report.html")
        write_page(out / "report.html", page)
        self.children.close()
        self.folder.commit()
        return AnalysisResult(self.out, exchanges, groups, summary, [self.out / name for name in names],
                              self.warnings)


def _small(cs: CaptureSet) -> bool:
    """The capture set's files hold less than extract.SMALL_CAPTURE_BYTES: forking workers and children (the
    extraction's, the clock pass's, the writer's) costs more there than running their work here, one after the
    other. Not small when a file cannot be read (the extraction says why)."""
    try:
        return sum(extract.capture_bytes(p) for p in cs.points) < extract.SMALL_CAPTURE_BYTES
    except OSError:
        return False


def _beside_the_view(decomposed: pd.DataFrame) -> dict:
    """What the summary and the report read of the decomposition's columns alone, from the table as the
    decomposition left it (one DB point): the query profile (unspanned_profile), summary.json → latency_s
    (latency_quantiles) and the report's table of components (component_rows). None of them reads the thread-pool
    view's columns, so a child forked then makes them beside the view, on the core that is otherwise idle (later the
    table's writer, the summary and the report share the cores), from the columns in their declared dtypes, as
    exchanges.parquet has them."""
    declared = tuple(c for c in (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS) if c.name in decomposed.columns)
    x = with_declared_dtypes(decomposed, declared)
    return {"profile": unspanned_profile(x), "latency": latency_quantiles(x), "components": component_rows(x)}


def _write_outputs(out: Path, cs: CaptureSet, exchanges: pd.DataFrame, groups: pd.DataFrame, pool: pd.DataFrame,
                   summary: dict, csv: bool, partitioned: bool) -> list[str]:
    """The tables and summary.json into `out`; returns their names (report.html follows them)."""
    names = _write_tables(out, cs, exchanges, groups, pool, csv, partitioned)
    names.append(_write_summary(out, summary))
    return names


def _write_tables(out: Path, cs: CaptureSet, exchanges: pd.DataFrame, groups: pd.DataFrame, pool: pd.DataFrame,
                  csv: bool, partitioned: bool) -> list[str]:
    """The tables into `out` (Parquet, --csv, --partitioned); returns their names."""
    names = []
    for name, df in (("exchanges.parquet", exchanges), ("groups.parquet", groups), ("pool.parquet", pool)):
        write_table(df, out / name)
        names.append(name)
        release_memory()
    if csv:
        write_table(exchanges, out / "exchanges.csv")
        names.append("exchanges.csv")
    if partitioned:
        from ..core.dataset import host_of, write_dataset

        hosts = {p.name: host_of(p.given if Path(p.given).is_dir() else p.name) for p in cs.points}
        names.append(write_dataset(exchanges, out / DATASET_NAME, hosts))
    return names


def _write_summary(out: Path, summary: dict) -> str:
    """summary.json into `out`; returns its name."""
    write_text(out / "summary.json", summary_json(summary))
    return "summary.json"

