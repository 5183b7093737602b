"""What a command says on the terminal while it runs, besides its result: a progress bar and warnings (on stderr,
so a command's output stays clean to pipe)."""

from __future__ import annotations

import re
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
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            console = Console(stderr=True)
            bar = Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), DownloadColumn(),
                           TransferSpeedColumn(), TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                           console=console, transient=True, disable=not console.is_terminal)
            bar.start()
            state.update(bar=bar, task=bar.add_task(terminal_text(label), total=total, rate=""), start=time.monotonic())
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


# What a terminal acts on instead of showing: C0 controls (ESC starts OSC 52 clipboard writes, OSC 0 titles, OSC 8
# links), DEL, C1 controls (U+009B is a one-character CSI, U+009D an OSC), bidi controls that reorder what is shown
# (Trojan Source), lone surrogates. Tab and line feed are shown as such where a text may span lines.
_UNSAFE_ONE_LINE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _shown(m: re.Match) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(text: object, lines: bool = False) -> str:
    """Any text for the terminal, made inert: every character a terminal would act on is shown as `\\xNN` (or
    `\\uNNNN`); `lines`: line feeds are kept (a multi-line verdict), else shown too (one line stays one line).
    The result is plain text: print it without markup (`say`), never through rich's markup."""
    return (_UNSAFE_LINES if lines else _UNSAFE_ONE_LINE).sub(_shown, str(text))


def say(text: object, err: bool = False, lines: bool = False) -> None:
    """Print a line of output (stdout, or stderr with `err`), made safe by terminal_text: every command prints
    through here."""
    print(terminal_text(text, lines), file=sys.stderr if err else sys.stdout, flush=err)


def warn(message: str) -> None:
    say(f"warning: {message}", err=True)
