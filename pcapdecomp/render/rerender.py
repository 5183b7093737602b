"""`pcapdecomp report ANALYSIS_DIR`: an analysis folder (what `analyze --out` wrote) rendered again, for the terminal
(text), a ticket (md) or a browser (html), without reading the captures again.

A folder handed to this command may be anything: it must hold exchanges.parquet and summary.json as `analyze`
writes them (a JSON object with a verdict, a table with the profile's columns), else one line and exit 2."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..core.errors import InputError, UsageError

FORMATS = ("text", "md", "html")
# what the profile and the page read of exchanges.parquet: a table without them is not an analysis
NEEDED_COLUMNS = ("fingerprint", "query_id", "sql", "total_s", "server_s", "exec_s", "exec_source", "queue_s",
                  "client")


@dataclass
class Rendered:
    text: str | None  # text or md: what to print; html: None (written to `written`)
    written: Path | None


def report(analysis_dir: Path, fmt: str = "text", top: int = 10, order_by: str | None = None,
           server_vars: Path | None = None, out: Path | None = None) -> Rendered:
    from ..explain.playbook import lines as playbook_lines
    from ..read.servervars import read_server_vars
    from ..explain.playbook import settings_beside
    from ..explain.waitprofile import ORDERS, profile, slow_entries

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if order_by is not None and order_by not in ORDERS:
        raise UsageError(f"--order-by {order_by!r}: choose one of {', '.join(ORDERS)}")
    if top < 1:
        raise UsageError(f"--top must be ≥ 1, got {top}")
    x, summary = load(analysis_dir)
    settings = read_server_vars(server_vars) if server_vars is not None else settings_beside(summary)
    book = playbook_lines(summary, x, settings)
    if fmt == "html":
        summary = {**summary, "playbook": book}
        return Rendered(None, _html(analysis_dir, x, summary, out))
    prof, used = profile(x, order_by, slow_entries(summary))
    from .text import markdown, text

    body = (text if fmt == "text" else markdown)(summary, prof, used, book, top)
    if out is not None:
        from ..core.outputs import write_text

        write_text(out, body)
        return Rendered(None, out)
    return Rendered(body, None)


def load(analysis_dir: Path) -> tuple[pd.DataFrame, dict]:
    """exchanges.parquet and summary.json of an analysis folder, checked: InputError (one line) for anything else."""
    from .evidence import load_analysis

    x, summary = load_analysis(analysis_dir)
    if not isinstance(summary, dict) or not isinstance(summary.get("verdict"), str) or "set" not in summary:
        raise InputError(f"{analysis_dir / 'summary.json'}: not an analysis summary (no verdict): run `pcapdecomp "
                         "analyze` again")
    missing = [c for c in NEEDED_COLUMNS if c not in x.columns]
    if missing:
        raise InputError(f"{analysis_dir / 'exchanges.parquet'}: not an analysis table (no {', '.join(missing)}): "
                         "run `pcapdecomp analyze` again")
    return x, summary


def _html(analysis_dir: Path, x: pd.DataFrame, summary: dict, out: Path | None) -> Path:
    """report.html again from the folder's tables (the connections' set-up times, which only the captures hold,
    are left out)."""
    from .report import render_page, write_page

    groups = _table(analysis_dir / "groups.parquet")
    pool = _table(analysis_dir / "pool.parquet")
    first = (summary.get("inputs") or {}).get("db")
    if groups is not None and "db_point" in groups.columns and first is not None:
        groups = groups[groups["db_point"].astype(object) == first].drop(columns="db_point")
    if pool is not None and "db_point" in pool.columns and first is not None:
        pool = pool[pool["db_point"].astype(object) == first].drop(columns="db_point")
    target = out if out is not None else analysis_dir / "report.html"
    page = render_page(summary, x, groups if groups is not None else pd.DataFrame(), None, None, pool)
    write_page(target, page)
    return target


def _table(path: Path) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: not readable as Parquet: {err}") from None
