"""Command line: thin commands over the stages (analysis.analyze, read.extract.read_exchanges, compare, render.evidence). The only place that turns errors into messages and exit codes.

Start-up is part of every command's time: this module imports only typer and what every command needs; pandas,
pyarrow and the stages are imported by the command that uses them, when it runs (`--help` imports neither:
tests/test_cli.py checks)."""

from __future__ import annotations

import gc
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from . import __version__
from .core.console import say, terminal_text
from .core.errors import PcapdecompError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Where did this query's time go? Read MySQL/MariaDB traffic from tcpdump captures.\n\n"
         "Exit codes: 0 done, 2 a user mistake (one line on stderr), 70 an internal error (one line; the traceback "
         "in the file it names), 130 interrupted, 143 terminated (SIGTERM: cleaned up as after Ctrl-C).",
    context_settings={"help_option_names": ["-h", "--help"]},
)
lab_app = typer.Typer(no_args_is_help=True, help="Record real MariaDB thread-pool incidents on two test hosts.")
app.add_typer(lab_app, name="lab")


def _version(value: bool) -> None:
    if value:
        print(f"pcapdecomp {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    pass


@app.command()
def guide(
    server: str = typer.Option(..., "--server", "-s", help="The MySQL/MariaDB server to capture: IP:PORT.",
                               show_default=False),
    app_host: list[str] = typer.Option([], "--app-host", help="An app host's IP address (repeatable): a capture "
                                                               "there too, for the network and the clients' side."),
    duration: int = typer.Option(600, "--duration", help="Seconds to capture."),
    out: Path = typer.Option(Path("pcapdecomp-capture"), "--out", "-o",
                             help="The capture-set folder (the same path on every host); capture.toml is written "
                                  "there now."),
    rotate_mb: int = typer.Option(100, "--rotate-mb", help="tcpdump starts a new file every N million bytes (-C)."),
    packet_rate: float = typer.Option(5000.0, "--packet-rate", help="Packets per second through the server's port, "
                                                                    "for the disk estimate."),
    packet_bytes: int = typer.Option(200, "--packet-bytes", help="Mean packet size in bytes, for the disk estimate."),
    interface: str = typer.Option("any", "--interface", "-i", help="tcpdump's interface on every host."),
    mysql: str = typer.Option("mysql", "--mysql", help="How to run the mysql client as an admin on the DB host "
                                                      "(e.g. 'mysql -u root -p')."),
    long_query_time: Optional[float] = typer.Option(None, "--long-query-time",
                                                    help="The server's long_query_time, if you know it (written "
                                                         "to capture.toml)."),
    thread_pool_size: Optional[int] = typer.Option(None, "--thread-pool-size",
                                                   help="The server's thread_pool_size, if you know it (written "
                                                        "to capture.toml; else analyze infers it)."),
) -> None:
    """Print the capture plan for SERVER: the tcpdump command on each host, the SQL before and after, the slow log
    for the window, a TLS key log, the disk it takes, and the `analyze` command that reads the result. Writes
    OUT/capture.toml."""
    from .guide import GuideOptions, plan, write_capture_toml

    opts = GuideOptions(server=server, app_hosts=list(app_host), duration_s=duration, out=out, rotate_mb=rotate_mb,
                        packet_rate=packet_rate, packet_bytes=packet_bytes, interface=interface, mysql=mysql,
                        long_query_time=long_query_time, thread_pool_size=thread_pool_size)
    text = plan(opts)  # checks every option before anything is written
    write_capture_toml(opts)
    sys.stdout.write(text)


@app.command()
def exchanges(
    capture: Path = typer.Argument(..., help="pcap or pcapng capture, optionally gzip-compressed."),
    server: list[str] = typer.Option(
        [], "--server", "-s", help="MySQL server endpoint HOST:PORT (repeatable). Default: found by content."
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the exchanges table to FILE.parquet or FILE.csv."),
    connections_out: Optional[Path] = typer.Option(
        None, "--connections", help="Also write the connections table to FILE.parquet or FILE.csv."
    ),
    max_sql_bytes: int = typer.Option(1 << 20, "--max-sql-bytes", min=16, help="Keep at most this many bytes of each statement (longer ones are marked sql-cut)."),
    tls_keylog: list[Path] = typer.Option(
        [], "--tls-keylog", help="NSS key log of the clients' TLS sessions (SSLKEYLOGFILE's format; repeatable): the "
                                 "TLS connections it has secrets for are decrypted (docs/tls.md). Secrets a pcapng "
                                 "capture embeds (Decryption Secrets Block) are used too."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary."),
    jobs: Optional[int] = typer.Option(
        None, "--jobs", "-j", min=1,
        help="Worker processes (default: the cores available, at most 8). A capture is split by connection only when the "
             "native fast lane does not read it (no compiler, PCAPDECOMP_NO_LANE=1) and it is 16 MiB or more.",
    ),
) -> None:
    """Parse CAPTURE into one row per MySQL request/response exchange and print a summary."""
    _one_blas_thread()  # first: the imports below import numpy
    with _imports_uncollected():
        from .core.console import capture_problems, warn
        from .core.outputs import check_output, write_table
        from .core.tables import arrow_without_pandas
        from .core.workers import default_jobs
        from .read.extract import read_exchanges

    for path in (out, connections_out):
        if path is not None:
            check_output(path)
    arrow_without_pandas()
    result = read_exchanges(capture, server, quiet, max_sql_bytes, jobs or default_jobs(), list(tls_keylog))
    quality = result.quality()
    problem = capture_problems(quality)
    if problem:
        warn(problem)
    from .core.schema import CONNECTION_COLUMNS, EXCHANGE_COLUMNS
    from .core.tables import file_schema

    for name, path, columns in (("exchanges", out, EXCHANGE_COLUMNS),
                                ("connections", connections_out, CONNECTION_COLUMNS)):
        if path is None:
            continue
        table = result.arrow(name)  # the table as extraction made it: Parquet without pandas
        if table is not None and path.suffix.lower() == ".parquet":
            write_table(table, path, file_schema(columns))
        else:
            write_table(getattr(result, name), path)
    if not quiet:
        _print_summary(result, quality)
    _Exit.fast = True


class _Exit:
    """`fast`: the command has written everything, and main may end the process without tearing the interpreter
    down (freeing the tables and every module's objects one by one, work whose result nobody sees).
    Set by commands whose outputs are closed files (nothing left in a buffer but stdout's and stderr's)."""

    fast = False


def _tls_words(quality: dict) -> str:
    """': 3 decrypted, 2 timed' — how the TLS connections were read (docs/tls.md)."""
    parts = [f"{quality[f'tls_{m}_connections']} {m}" for m in ("decrypted", "timed", "unreadable")
             if quality.get(f"tls_{m}_connections")]
    return f": {', '.join(parts)}" if parts else ""


def _print_summary(result, quality: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    ex = result.exchanges
    say(
        f"{result.capture}: {quality['frames']} frames, {quality['mysql_connections']} MySQL connections "
        f"({quality['midstream_connections']} mid-stream, {quality['tls_connections']} TLS{_tls_words(quality)}), "
        f"{quality['exchanges']} exchanges"
    )
    if len(ex):
        table = Table("command", "count", "errors", "p50 ms", "max ms", box=None)
        for command, group in ex[["command", "response_s", "result"]].groupby("command", sort=True, observed=True):
            resp = group["response_s"].dropna() * 1000
            table.add_row(
                Text(terminal_text(command)),
                str(len(group)),
                str(int((group["result"] == "error").sum())),
                f"{resp.median():.3f}" if len(resp) else "-",
                f"{resp.max():.3f}" if len(resp) else "-",
            )
        Console(highlight=False).print(table)
        errors = ex["error_code"].dropna().astype(int).value_counts()
        if len(errors):
            say("errors: " + ", ".join(f"{code}×{n}" for code, n in errors.items()))
        problems = ex["problems"].str.split(",").explode()
        problems = problems[problems.astype(bool)].value_counts()
        if len(problems):
            say("problems: " + ", ".join(f"{name}×{n}" for name, n in problems.items()))
    quality_bits = [
        f"{k}={quality[k]}"
        for k in ("frames_truncated", "frames_ip_fragment", "frames_undecodable", "frames_bad_ts", "gaps", "gaps_forced",
                  "gap_bytes", "unparsed_bytes", "tls_unreadable_bytes", "violations", "out_of_range",
                  "retransmission_conflicts", "if_drops")
        if quality.get(k)
    ]
    if quality_bits:
        say("capture quality: " + ", ".join(quality_bits))


@app.command()
def analyze(
    capture_set: Optional[list[Path]] = typer.Argument(
        None, help="Capture-set folder (app*.pcap[ng], db*.pcap[ng], proxy*.pcap[ng], rotated files, app-<host>/ and "
                   "db[-<name>]/ subfolders, slow*.log, capture.toml) that fills in the options."
    ),
    app_captures: list[str] = typer.Option(
        [], "--app", "-a", help="App-side capture point (repeatable: one per app host): a file, a quoted glob of its "
                                "rotated files ('app.pcap*'), or a folder of them."),
    db_capture: list[str] = typer.Option(
        [], "--db", "-d", help="DB-side capture point: a file, a quoted glob of its rotated files ('db.pcap*'), or a "
                               "folder of them. Repeatable: one per DB server (a primary and a replica, shards)."),
    proxy_captures: list[Path] = typer.Option(
        [], "--proxy", "-p", help="Capture on the proxy host between app and DB, its client and server sides "
                                  "(repeatable, e.g. one file per interface)."),
    proxy_server: list[str] = typer.Option(
        [], "--proxy-server", help="The proxy's listening endpoint HOST:PORT (repeatable). Default: told apart by content."),
    slow_log: list[Path] = typer.Option(
        [], "--slow-log", help="The server's slow query log (plain or .gz); with several --db, one per --db in order."),
    slow_log_tz: Optional[str] = typer.Option(
        None, "--slow-log-tz", help="Time zone of zoneless slow-log times, e.g. Europe/Berlin (default UTC)."
    ),
    since: Optional[str] = typer.Option(
        None, "--since", metavar="TIME",
        help="Analyse a time window of the captures: keep the exchanges whose request began at or after TIME "
             "(ISO 8601, 2026-11-27T10:00:06Z; without a zone in --slow-log-tz's, else UTC; or epoch seconds), "
             "each capture point by its own clock. Every capture is still read whole, so connections opened and "
             "statements prepared before the window are known in it; memory follows the window (docs/scale.md)."),
    until: Optional[str] = typer.Option(
        None, "--until", metavar="TIME",
        help="The window's end: keep the exchanges whose request began before TIME (as --since)."),
    long_query_time: Optional[float] = typer.Option(None, "--long-query-time", help="The server's long_query_time, seconds."),
    thread_pool_size: Optional[int] = typer.Option(None, "--thread-pool-size", help="The server's thread_pool_size (thread group = conn_id mod N)."),
    processlist: Optional[Path] = typer.Option(
        None, "--processlist",
        help="A processlist snapshot taken during the capture (mysql -B -e \"SHOW FULL PROCESSLIST\" > FILE, or the "
             "boxed table mysql prints): names the connections the capture saw no greeting of, by HOST ip:port. "
             "Default: the set folder's processlist*.tsv|txt."),
    server: list[str] = typer.Option(
        [], "--server", "-s", help="MySQL server endpoint HOST:PORT, or NAME=HOST:PORT to name a DB server in the "
                                   "verdict (repeatable). Default: found by content."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o",
        help="Output folder (default reports/<set name>/). Its previous outputs are replaced as a set when the run "
             "succeeds; other files stay. One run at a time per folder."),
    csv: bool = typer.Option(False, "--csv", help="Also write exchanges.csv (cells that start like a formula get a leading ')."),
    partitioned: bool = typer.Option(
        False, "--partitioned", help="Also write exchanges/ as a Parquet dataset partitioned host=…/capture=… (DuckDB, "
                                     "Spark and Dask read it directly)."),
    max_sql_bytes: int = typer.Option(1 << 20, "--max-sql-bytes", min=16, help="Keep at most this many bytes of each statement, on the wire and in the slow log (longer ones are marked sql-cut / cut, and join the slow log by their prefix)."),
    evidence_too: bool = typer.Option(
        False, "--evidence", help="Also write ticket evidence for the hidden-slow exchanges (see `evidence`)."
    ),
    server_vars: Optional[Path] = typer.Option(
        None, "--server-vars", help="The server's settings for what to change: what `mysql -B -e \"SHOW GLOBAL "
                                    "VARIABLES\"` prints (default: capture.toml's [server])."),
    tls_keylog: list[Path] = typer.Option(
        [], "--tls-keylog", help="NSS key log of the clients' TLS sessions (SSLKEYLOGFILE's format; repeatable): the "
                                 "TLS connections it has secrets for are decrypted (docs/tls.md). A capture-set folder's tls-keys.log is used without it, and secrets a pcapng "
                                 "capture embeds (Decryption Secrets Block) are used too."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, no warnings, no verdict on the terminal."),
    memory: Optional[str] = typer.Option(
        None, "--memory", metavar="SIZE",
        help="The memory the analysis may take, e.g. 8G, 800M, 1.5GiB (default: capture.toml's memory, else 80 % "
             "of what this machine, or its cgroup's limit, has available at the start). A capture that would need "
             "more in memory is analysed partitioned instead (as --spill, its partitions in the output folder; said "
             "in one warning) when the partitioned run fits and takes the set; else refused early (exit 2, nothing "
             "written), saying how much it needs: give more, or analyse a time window of it (docs/scale.md, "
             "Memory). Captures of more than about 5 times the bound are read into that folder first, then read "
             "back into memory if their counts fit."),
    in_memory: bool = typer.Option(
        False, "--in-memory",
        help="Never partitioned without --spill: a capture too big for --memory in memory is refused (exit 2) "
             "instead of analysed partitioned in the output folder."),
    spill: Optional[Path] = typer.Option(
        None, "--spill", metavar="DIR",
        help="The partitioned run: the captures' exchanges go to a folder of the run's own in DIR (removed when the "
             "run ends) and are analysed a partition at a time, so the memory grows less with the capture (841 MiB "
             "against 1,354 at 4.5 GB a point, for about 4 times the CPU: docs/scale.md); the same outputs, a slow "
             "log joined per connection, several app points of one DB point. A set it does not take yet (a proxy, "
             "one not captured — fewer than half the exchanges paired directly —, several DB points, a slow log it "
             "cannot join per connection, --csv, --partitioned) is analysed in memory, after one line saying why; "
             "so is a pair that lost frames, for the loss repair, unless in memory it would pass --memory: then it "
             "is partitioned without the repair, said in a warning (docs/scale.md). With --scheduler the Dask "
             "workers read the captures and do the partitions' work; they must read and write DIR at the "
             "same path (a LocalCluster: yes; a real cluster: a shared file system; a worker that cannot is said in "
             "one line and the run is this machine's)."),
    jobs: Optional[int] = typer.Option(
        None, "--jobs", "-j", min=1,
        help="Worker processes (default: the cores available, at most 8; one for capture files under 16 MiB in all, "
             "where starting processes costs more than it saves): the captures are read side by side, and one "
             "the native fast lane does not read (no compiler, PCAPDECOMP_NO_LANE=1) is split by connection when workers are left.",
    ),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler",
        help="Read the captures on a Dask cluster: the scheduler's address (tcp://HOST:8786), or 'local' for a "
             "LocalCluster on this machine (--jobs workers). The capture files must be readable at the same path "
             "on every worker (a shared file system). With --spill DIR the workers take the partitions instead "
             "(DIR shared likewise). Needs dask.distributed (the package's dask extra). A "
             "scheduler runs code in this process: use only one you trust (docs/security.md)."),
    scheduler_tls: Optional[str] = typer.Option(
        None, "--scheduler-tls", metavar="CA,CERT,KEY",
        help="For a tls:// --scheduler: the CA file and this client's certificate and key (PEM)."),
) -> None:
    """Split each query's latency into network, queueing and execution; flag hidden-slow queries; write a report.

    Writes exchanges.parquet, groups.parquet, pool.parquet, summary.json and report.html to the output folder, as one
    set: a run that fails or is interrupted leaves the previous set as it was.
    """
    _one_blas_thread()
    from .core.errors import UsageError
    from .core.memory import parse_size
    from .core.window import window_of
    from .read.captureset import capture_set as capture_set_of
    from .read.captureset import time_zone

    with _imports_uncollected():
        # the capture set is made (and a mistake in it refused) before the stages, pandas and pyarrow are imported
        folders = list(capture_set or [])
        if len(folders) > 1:
            raise UsageError(f"one capture-set folder expected, got {len(folders)} arguments ({folders[0]}, "
                             f"{folders[1]}, …): quote a glob given to --app or --db (--db 'db.pcap*') so that "
                             "pcapdecomp expands it, not the shell")
        if memory is not None:
            parse_size(memory, "--memory")  # a mistake costs a second, not an extraction
        # as the memory: refused before any work (the zone's import, only for a window)
        window = window_of(since, until, time_zone(slow_log_tz)) if since or until else None
        if in_memory and spill is not None:
            raise UsageError("--in-memory and --spill DIR: give one of them (--spill analyses partitioned, "
                             "--in-memory never does)")
        if scheduler_tls is not None and scheduler is None:  # else the run would read on one machine, without TLS
            raise UsageError("--scheduler-tls is for a tls:// scheduler address: give it with --scheduler "
                             "tls://HOST:PORT")
        settings = None
        if server_vars is not None:
            from .read.servervars import read_server_vars

            settings = read_server_vars(server_vars)  # read before any work: a wrong file costs a second
        cs = capture_set_of(folders[0] if folders else None, app=app_captures, db=db_capture, slow_log=slow_log,
                            long_query_time=long_query_time, thread_pool_size=thread_pool_size, servers=server,
                            proxy=proxy_captures, proxy_servers=proxy_server, processlist=processlist,
                            tls_keylog=tls_keylog, server_settings=settings, window=window)
        from .analysis import Options
        from .analysis import analyze as run_analysis
    options = Options(jobs=jobs, quiet=quiet, csv=csv, partitioned=partitioned, slow_log_tz=slow_log_tz,
                      max_sql_bytes=max_sql_bytes, scheduler=scheduler, scheduler_tls=scheduler_tls,
                      command_line=" ".join(["pcapdecomp", *sys.argv[1:]]), memory=memory, spill=spill,
                      in_memory=in_memory)
    result = run_analysis(cs, options, out)
    written = list(result.written)
    if evidence_too:
        from .core.errors import internal_errors_to
        from .render.evidence import export

        with internal_errors_to(result.out_dir):
            written += export(result.out_dir).written
    if not quiet:
        say(result.summary["verdict"], lines=True)
        for line in result.summary.get("playbook") or []:  # what to change, from the server's settings
            say(f"→ {line['text']}" + (f" {line['sql']}" if line.get("sql") else ""))
        for path in written:
            say(f"wrote {path}")


@app.command()
def evidence(
    analysis: Path = typer.Argument(..., help="Output folder of `pcapdecomp analyze` (exchanges.parquet, summary.json)."),
    query_id: list[str] = typer.Option([], "--query-id", help="Select exchanges of this Query ID (repeatable)."),
    conn_id: list[int] = typer.Option([], "--conn-id", help="Select exchanges of this connection id (repeatable)."),
    top: Optional[int] = typer.Option(None, "--top", help="Keep only the N slowest of the selection."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default ANALYSIS/evidence/)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing."),
) -> None:
    """Write ticket evidence: per capture point a pcapng with just the selected exchanges' packets (commented),
    summary.md and exchanges.csv. Default selection: the hidden-slow exchanges, else the 10 slowest."""
    from .render.evidence import export

    result = export(analysis, query_id, conn_id, top, out)
    if not quiet:
        say(f"{len(result.rows)} exchanges ({result.how})")
        for path in result.written:
            frames = next((n for src, n in result.frames.items() if result.files[src] == path), None)
            say(f"wrote {path}" + (f" ({frames} frames)" if frames is not None else ""))


@app.command()
def report(
    analysis: Path = typer.Argument(..., help="Output folder of `pcapdecomp analyze` (exchanges.parquet, summary.json)."),
    format: str = typer.Option("text", "--format", "-f",
                               help="text (the terminal, 100 columns), md (Markdown for a ticket) or html (the page)."),
    top: int = typer.Option(10, "--top", min=1, help="Query classes listed in the profile."),
    order_by: Optional[str] = typer.Option(
        None, "--order-by", help="Rank the profile by client (what the clients waited, A4 − A1: the default with an "
                                 "app capture), server (D4 − D1: the default with a DB capture alone) or exec."),
    server_vars: Optional[Path] = typer.Option(
        None, "--server-vars", help="The server's settings: what `mysql -B -e \"SHOW GLOBAL VARIABLES\"` prints "
                                    "(default: capture.toml beside the captures)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write to FILE (default: text and md to stdout, html "
                                                                 "to ANALYSIS/report.html)."),
) -> None:
    """Render an analysis again: the verdict, what to change (a playbook line per finding, from the server's
    settings) and the query profile ranked by what the clients waited, like pt-query-digest's."""
    from .render.rerender import report as run_report

    result = run_report(analysis, format, top, order_by, server_vars, out)
    if result.text is not None:
        say(result.text.rstrip("\n"), lines=True)
    elif result.written is not None:
        say(f"wrote {result.written}", err=True)


@app.command()
def compare(
    folders: list[Path] = typer.Argument(
        ..., help="BEFORE AFTER [MORE…]: analysis folders (what `analyze` wrote) or capture-set folders (analysed "
                  "on the way, into OUT/analyses/), in order; the first is the baseline.", show_default=False,
        metavar="FOLDER"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default reports/compare-<A>-vs-<B>…/)."),
    slow: float = typer.Option(0.1, "--slow", help="Seconds of wire time above which an exchange counts as slow on "
                                                   "the wire (the four-point incident: 0.1)."),
    csv: bool = typer.Option(False, "--csv", help="Also write comparison.csv."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, no headline on the terminal."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1,
                                       help="Worker processes for capture sets analysed on the way (as `analyze`)."),
) -> None:
    """Compare analyses before and after a change: slow on the wire, hidden slow, slow log, per component, thread
    group and Query ID, with the change against the first; notes where the captures are not comparable.

    Writes comparison.html, comparison.parquet and comparison.json to the output folder.
    """
    from .compare import compare as run_compare

    result = run_compare(list(folders), out, slow, csv=csv, quiet=quiet, jobs=jobs,
                         command_line=" ".join(["pcapdecomp", *sys.argv[1:]]))
    if not quiet:
        if result.sentence:
            say(result.sentence)
        for line in result.headline:
            say(line)
        for note in result.notes:
            say(f"{note.severity}: {note.text}")
        for path in result.written:
            say(f"wrote {path}")


@app.command()
def columns(
    table: str = typer.Argument(
        "exchanges", help="exchanges (from `exchanges`), analysis (columns `analyze` adds), proxy (of them, the "
                          "proxy's), groups, pool, connections, summary (summary.json keys), quality (a capture "
                          "point's quality in summary.json → captures), slowlog (the slow log as read), comparison, "
                          "comparison-metrics, comparison-json (what `compare` writes), dataset (columns "
                          "--partitioned adds), or capture-toml (the keys of a capture set's capture.toml)"
    ),
) -> None:
    """Print a table's columns: name, dtype and meaning (as in the docs)."""
    from .core.schema import TABLES, markdown_table

    chosen = TABLES.get(table)
    if chosen is None:
        from .core.errors import UsageError

        raise UsageError(f"unknown table {table!r}: choose one of {', '.join(TABLES)}")
    print(markdown_table(chosen))


@lab_app.command("record")
def lab_record(
    scenario: str = typer.Argument(..., help="Scenario name (see captures/lab/README.md)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Capture-set folder to write (default captures/<scenario>)."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Override the scenario's duration, seconds."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed for the workload."),
    no_install: bool = typer.Option(False, "--no-install", help="Do not apt-get/pip install missing tools."),
) -> None:
    """Record SCENARIO from a private MariaDB in two network namespaces (needs root, and a source checkout: run it
    from the checkout's root).

    Scenarios (captures/lab/README.md): maxthreads, group-stall, group-stall-tls13, group-stall-tls12,
    oltp-prepared-tls13, oltp-prepared-tls12 (over TLS, with the clients' key log), oltp-hogs, oltp-prepared,
    connection-churn, connection-storm, connection-refused, network-slow-client, features, midstream-join,
    slowlog-forms, sysbench, sysbench-rw (oltp_read_write, prepared, a slow log), bigpacket, proxy-l4, proxy-pool,
    stall-fix (a series of three), field-default-stall, field-default-stall-lqt-10, field-pool-before-capture (the
    field: no pool settings at hand).
    """
    from .lab import run_lab

    run_lab(scenario, out, duration, seed, install=not no_install)


def main() -> None:
    """Exit codes: 0 done, 2 a user mistake (one line), 70 an internal error (one line, the traceback in a file),
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM). No traceback reaches the terminal."""
    _Terminated.seen = False
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        _command()
    finally:  # a caller in the same process (a test) keeps its own
        signal.signal(signal.SIGTERM, previous)


def _command() -> None:
    from .core.errors import as_error

    _Exit.fast = False  # this invocation's: a command run before in the same process (a test) does not count
    try:
        _returning_allocator()
        _plain_values_without_pydantic()
        code = app(standalone_mode=False)  # typer turns Ctrl-C inside a command into the return value 130
    except PcapdecompError as exc:
        _exit(exc)
    except typer.Exit as exc:
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        code = 130
    except Exception as exc:  # usage errors of click, or of the click that newer typer versions carry inside
        show, usage_code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(usage_code, int):
            import io

            shown = io.StringIO()
            show(file=shown)  # click words it; its values (a path, an option) are outside text
            say(shown.getvalue().rstrip("\n"), err=True, lines=True)
            sys.exit(usage_code)
        _exit(as_error(exc))
    run_exit_functions = _exit_functions() if _Exit.fast and code in (0, None) and _threading_idle() else None
    if run_exit_functions is not None:
        run_exit_functions()  # what a normal end runs first (logging's flush, …)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if code == 130:
        print("pcapdecomp: terminated" if _Terminated.seen else "pcapdecomp: interrupted", file=sys.stderr)
        if _Terminated.seen:
            code = 128 + signal.SIGTERM
        # now, not after joining the threads of a process pool whose workers were ended (core.workers.worker_pool); the
        # outputs were already put back by the stages' own clean-up while the interrupt unwound
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code if isinstance(code, int) else 0)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (kill, a service manager, a batch system's time limit) unwound as a Ctrl-C is: every stage's clean-up
    runs (the --spill folder removed, the output folder as it was, the workers ended); the exit code is 143."""

    seen = False


def _terminated(signum, _frame) -> None:
    _Terminated.seen = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM does not cut the clean-up short
    raise _Terminated


def _exit_functions():
    """CPython's atexit._run_exitfuncs (not public API): the registered handlers a normal end runs, for an end by
    os._exit that skips the interpreter's teardown (the command's tables and modules freed one by one, work
    nobody sees: its cost is in docs/speed.md). None where it is missing: the process then ends normally."""
    import atexit

    run = getattr(atexit, "_run_exitfuncs", None)
    return run if callable(run) else None


def _threading_idle() -> bool:
    """No thread but the main one runs (one that does is joined by the interpreter's normal end)."""
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def _plain_values_without_pydantic() -> None:
    """typer (0.29 and later) converts every option's value with a pydantic TypeAdapter, built on first use:
    importing pydantic and building them is a large part of a small command's start-up (its cost is in
    docs/speed.md). The values this CLI takes are plain (a flag, a path, a whole number, a decimal number, text, lists of them):
    those are converted here as pydantic converts them, and anything else (a number out of range or not a number,
    an empty path…) goes to typer's own conversion, which also words the error.

    This reaches into typer's private modules (typer._coercion, typer._param_types, typer.core._TyperParameter's
    get_runtime_param, its type_descriptor): a typer that moves or changes them must not break the CLI, only make
    it slower. So: a name missing, the layer is not put in; a call of it that fails on typer's side (TypeError,
    AttributeError: a signature or an attribute changed), typer's own conversion takes the value
    (tests/test_cli.py runs the CLI with the layer unable to apply)."""
    try:
        from typer import core
        from typer._coercion import PassThroughRuntimeParam, build_runtime_param
        from typer._param_types import coerce_cli_path
    except ImportError:
        return
    parameter = getattr(core, "_TyperParameter", None)
    original = getattr(parameter, "get_runtime_param", None)
    if original is None or getattr(original, "plain", False) or not hasattr(PassThroughRuntimeParam, "_coerce_value"):
        return
    import dataclasses
    import re
    import types
    import typing

    unsure = object()
    whole = re.compile(r"[0-9]{1,18}\Z")
    decimal = re.compile(r"-?[0-9]{1,18}(\.[0-9]{1,18})?\Z")  # float() of it is what pydantic makes: both round correctly

    def plain(annotation, value, info, param, ctx):
        """`value` as typer makes it of `annotation`, or `unsure`."""
        origin = typing.get_origin(annotation)
        if origin in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(annotation) if a is not type(None)]
            return plain(inner[0], value, info, param, ctx) if len(inner) == 1 else unsure
        if origin is list:
            if not isinstance(value, (list, tuple)):
                return unsure
            made = [plain(typing.get_args(annotation)[0], v, info, param, ctx) for v in value]
            return unsure if any(v is unsure for v in made) else made
        if annotation is bool:
            return value if isinstance(value, bool) else unsure
        if annotation is str:
            return value if type(value) is str else unsure
        if annotation is Path and info.path_type is None:
            if type(value) is str and value:
                value = Path(value)  # what pydantic makes of the text; typer's checks of the path follow
            if not isinstance(value, Path):
                return unsure
            return coerce_cli_path(value, info, path_type=Path, param=param, ctx=ctx)
        if annotation is int and info.parser is None:
            number = value if type(value) is int else int(value) if type(value) is str and whole.match(value) else None
        elif annotation is float and info.parser is None:
            number = float(value) if type(value) is str and decimal.match(value) else None
        else:
            return unsure
        if number is None or (info.min is not None and number < info.min) or (
                info.max is not None and number > info.max) or info.clamp:
            return unsure  # typer's conversion words what is wrong with it
        return number

    @dataclasses.dataclass(frozen=True)
    class Plain(PassThroughRuntimeParam):
        def _coerce_value(self, value, param, ctx):
            try:
                made = plain(self.annotation, value, self.parameter_info, param, ctx)
            except (TypeError, AttributeError):  # typer's side changed: its own conversion
                made = unsure
            if made is unsure:
                return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)
            return made

    def get_runtime_param(self):
        try:
            if self._runtime_param is None and self.type_descriptor.file_annotation is None and (
                    self.type_descriptor.parameter_info.parser is None):
                self._runtime_param = Plain(parameter_info=self.type_descriptor.parameter_info,
                                            annotation=self.type_descriptor.annotation)
        except (TypeError, AttributeError):  # typer's parameters changed: its own conversion
            pass
        return original(self)

    get_runtime_param.plain = True
    parameter.get_runtime_param = get_runtime_param


@contextmanager
def _imports_uncollected():
    """The collector off while a command makes its imports (pandas, pyarrow, the stages: hundreds of thousands of
    objects that live as long as the process): its passes over them while they are made find no garbage. What the
    imports made is then frozen, out of the collector's later passes, which the command's many small objects set
    off (forked workers then also leave those objects' pages shared). Its cost: docs/speed.md."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if collecting:
            gc.enable()


def _one_blas_thread() -> None:
    """OpenBLAS (numpy's) with one thread, for a command that does no linear algebra: at numpy's import it starts a
    thread per core beyond the first that spins for a while, waiting for work that never comes, CPU taken from the
    command (0.12 s of the read-write 10 s `analyze`: docs/speed.md). Only before numpy is imported (OpenBLAS reads
    the variable then); an explicit setting wins."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _returning_allocator() -> None:
    """core.memory.use_returning_allocator, without importing pyarrow for a command that does not use it: Arrow reads
    this variable when it makes its default memory pool."""
    if "pyarrow" in sys.modules:
        from .core.memory import use_returning_allocator

        use_returning_allocator()
    else:
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"


def _exit(exc: PcapdecompError) -> None:
    from .core.errors import InternalError

    kind = "internal error" if isinstance(exc, InternalError) else "error"
    say(f"pcapdecomp: {kind}: {exc}", err=True)
    sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
