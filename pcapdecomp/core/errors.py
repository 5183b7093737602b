"""The one exception hierarchy. Only cli.py turns these into messages and exit codes."""

from __future__ import annotations

import errno
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class PcapdecompError(Exception):
    """Base of every error pcapdecomp raises on purpose. str(err) is the one-line user message."""

    exit_code = 2


class InputError(PcapdecompError):
    """A user mistake about an input file: missing, a directory, empty, not a capture, wrong kind."""


class CaptureFormatError(InputError):
    """The file is not a capture pcapdecomp can read (unknown magic, unknown link type, garbage)."""


class SlowLogError(InputError):
    """The file given as a slow log is not one."""


class UsageError(PcapdecompError):
    """Options that contradict each other or are out of range."""


class MemoryBoundError(UsageError):
    """The analysis would take more memory than its bound (--memory, or what the machine has available): refused
    before it does, nothing written."""


class PartitionedInstead(MemoryBoundError):
    """The in-memory analysis of a set the partitioned run takes would pass its bound, and the partitioned run would
    not (its predicted peak is within the bound) or may not (counted before the captures are read whole): `analyze`
    without --spill runs partitioned instead (run.spilled.spill_instead), or, with --in-memory, refuses with this
    message. `over`: what the in-memory run would need against the bound, in words (the warning's first part);
    `keep`: the --memory that would keep it in memory (as the refusal suggests it); `unrepaired`: a pair that lost
    frames, which the partitioned run analyses without the loss repair (so not the in-memory run's files); `early`:
    decided by the look during the extraction, before the counts: `keep` is the least such bound, an estimate."""

    def __init__(self, message: str, over: str, keep: str, unrepaired: bool = False, early: bool = False):
        super().__init__(message)
        self.over, self.keep, self.unrepaired, self.early = over, keep, unrepaired, early

    @property
    def keep_text(self) -> str:
        """The --memory that would keep it in memory, in words: "--memory 704M", or "at least --memory 448M" when
        only the look during the extraction said it (the counts may need more: a fresh pair of eyes followed
        "--memory 448M would keep it in memory" and was refused at 647 MiB)."""
        return f"at least --memory {self.keep}" if self.early else f"--memory {self.keep}"


class OutputError(PcapdecompError):
    """The output folder or file cannot be written (permissions, a full disk, a file in the way)."""


class InternalError(PcapdecompError):
    """A bug: an exception nobody raised on purpose. str(err) names it and the file that holds the traceback."""

    exit_code = 70  # EX_SOFTWARE


DETAILS_NAME = "internal-error.txt"


def internal_error(exc: BaseException, folder: Path | None = None) -> InternalError:
    """Save `exc`'s traceback (with the version and command line) to `folder`/internal-error.txt, or to a fresh
    file in the temporary folder when `folder` is None or cannot be written, and return the one-line error."""
    from .. import __version__

    text = (f"pcapdecomp {__version__} internal error, {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
            f"command: {' '.join(sys.argv)}\ncwd: {os.getcwd()}\npython: {sys.version.split()[0]} on {sys.platform}\n\n"
            + "".join(traceback.format_exception(exc)))
    path = None
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / DETAILS_NAME
            if not is_details_file(path) and (path.exists() or path.is_symlink()):
                path = None  # a file of that name we did not write is not ours to replace
            else:
                path.write_text(text, encoding="utf-8")
        except OSError:
            path = None
    if path is None:
        fd, name = tempfile.mkstemp(prefix="pcapdecomp-internal-error-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        path = Path(name)
    return InternalError(f"{_what(exc)} (details: {path})")


def is_details_file(path: Path) -> bool:
    """`path` is an internal-error.txt a run of ours wrote (its first line says so)."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"pcapdecomp ") and b" internal error, " in first


def _what(exc: BaseException) -> str:
    """'ValueError: first line of the message, in render.figures._connection_rate': the innermost pcapdecomp
    function on the traceback (its package, module and name) says which stage failed."""
    message = (str(exc).strip().splitlines() or [""])[0]
    if len(message) > 160:
        message = message[:159] + "…"
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = Path(frame.filename).with_suffix("").parts
        if "pcapdecomp" in parts[:-1]:
            inside = parts[len(parts) - 1 - parts[::-1].index("pcapdecomp") + 1:]
            where = ".".join([*inside, frame.name])
    text = type(exc).__name__ + (f": {message}" if message else "")
    return text + (f", in {where}" if where else "")


_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> OutputError | None:
    """The one-line error for a write that found the disk (or the user's quota) full, wherever it was raised (Arrow
    words it 'Error writing bytes to file. Detail: [errno 28] …' without setting errno); None for anything else."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and (exc.errno in _FULL or any(
                f"[errno {code}]" in str(exc).lower() for code in _FULL)):
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            return OutputError(f"{where}no space left on the device (or over the disk quota): free some space or "
                               "choose another --out")
        exc = exc.__cause__ or exc.__context__
    return None


def as_error(exc: BaseException, folder: Path | None = None) -> PcapdecompError:
    """What an unexpected exception is for the user: a full disk is one line (OutputError, exit 2), anything else
    an InternalError (its details saved, see internal_error)."""
    return disk_full(exc) or internal_error(exc, folder)


@contextmanager
def internal_errors_to(folder: Path | None) -> Iterator[None]:
    """Inside, an exception that is not a PcapdecompError (a bug, or a resource the code did not expect to run
    out) becomes an InternalError whose details are saved in `folder` (a full disk: an OutputError). Interrupts
    pass through."""
    try:
        yield
    except PcapdecompError:
        raise
    except Exception as exc:
        raise as_error(exc, folder) from exc
