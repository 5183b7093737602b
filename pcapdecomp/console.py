"""What a command says on the terminal while it runs, besides its result: a progress bar and warnings (on stderr,
so a command's output stays clean to pipe)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .schema import CAPTURE_PROBLEM_WORDS


@contextmanager
def progress_bar(quiet: bool, label: str) -> Iterator:
    """A rich progress bar on stderr (bytes done, MB/s, frames/s, ETA); None when quiet. The bar starts at the first
    update, so that worker processes are forked before its refresh thread exists, and quick runs show none."""
    if quiet:
        yield None
        return
    state: dict = {}

    def update(done: int, total: int, frames: int) -> None:
        if "bar" not in state:
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)

            console = Console(stderr=True)
            bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                           TransferSpeedColumn(), TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                           console=console, transient=True, disable=not console.is_terminal)
            bar.start()
            state.update(bar=bar, task=bar.add_task(label, total=total, rate=""), start=time.monotonic())
        elapsed = time.monotonic() - state["start"]
        rate = f"{frames / elapsed / 1000:,.0f}k frames/s" if elapsed > 0.5 else ""
        state["bar"].update(state["task"], completed=done, total=total, rate=rate)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].stop()


def capture_problems(q: dict) -> str | None:
    """One warning line per capture: damage, lost or unreadable frames, and whether MySQL was found at all."""
    counts = [f"{q[k]} {words}" for k, words in CAPTURE_PROBLEM_WORDS if q.get(k)]
    parts = []
    if q.get("damaged"):
        parts.append(f"{q['damaged']}; analysed the {q['frames']} frames before it")
    if counts:
        parts.append(", ".join(counts))
    if q.get("exchanges") == 0 and q.get("mysql_connections") == 0:
        parts.append(f"no MySQL traffic found ({q['frames']} frames read)")
    return f"{q['file']}: " + "; ".join(parts) if parts else None


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
