"""Forked processes for any stage: a pool of workers (`worker_pool`, `run_all`, `run_beside`), calls started ahead
of need (`Ahead`), one long-lived worker (`Worker`) and one forked child (`Forked`). Ctrl-C is the parent's to handle,
and a child dies with its parent.

Every result that comes back from a forked child crosses by `_pack` / `_unpack`: a big one (a capture's exchanges
table) as a file in shared memory that the parent maps, not through the pipe."""

from __future__ import annotations

import itertools
import mmap
import multiprocessing as mp
import os
import pickle
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager

from .errors import MemoryBoundError

# The handover of big results from a forked child to the parent. Through the pool's pipe a result is pickled to one
# bytes object in the child, read 64 KiB at a time into a buffer in the parent and unpickled from there: each array
# copied three times, into pages that are new each time (seconds for a table of hundreds of MB, docs/speed.md).
# Pickled with protocol 5 instead, the arrays stay out of
# the pickle (`buffer_callback`): the child writes them into one file in HANDOVER_DIR (shared memory) and sends only
# the file's name and where each array is in it; the parent maps each array's pages of the file (copy-on-write: what
# pandas writes in place stays the parent's own and never raises "read-only"), removes the file at once (the pages live
# as long as the maps) and unpickles on the maps, without a copy. Each array has its own map, so that one column the
# parent keeps does not hold the whole table's pages.
HANDOVER_DIR = os.environ.get("PCAPDECOMP_HANDOVER_DIR", "/dev/shm")  # "" switches the handover off: all by the pipe
HANDOVER_MIN_BYTES = 1 << 20  # a result with fewer bytes of arrays goes through the pipe: a file would not pay
_ARRAY_FILE_MIN_BYTES = 64 << 10  # smaller arrays of a big result go with the pickle: a map each would not pay
_PAGE = mmap.PAGESIZE
_CONTEXTS = itertools.count()  # numbers the pools and Forked children of this process: their files' prefix


_STALE_CHECKED = False  # whether this process removed the handover files of dead processes


def _handover_prefix() -> str:
    """The start of the names of the files the children of one pool (or one Forked) hand their results over in: the
    parent removes what is left of them when the pool ends (a child killed mid-write, Ctrl-C), and only those (two
    pools may be alive at once)."""
    global _STALE_CHECKED
    if not _STALE_CHECKED:
        _STALE_CHECKED = True
        _remove_stale()
    return f"pcapdecomp-{os.getpid()}-{next(_CONTEXTS)}-"


def _remove_stale() -> None:
    """Remove the handover files of processes that are gone (killed with SIGKILL, where no clean-up runs): files of
    this user whose process id names no process."""
    if not HANDOVER_DIR:
        return
    try:
        names = os.listdir(HANDOVER_DIR)
    except OSError:
        return
    dead: dict[int, bool] = {}
    for name in names:
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != "pcapdecomp" or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid not in dead:
            try:
                os.kill(pid, 0)
                dead[pid] = False
            except ProcessLookupError:
                dead[pid] = True
            except OSError:  # alive, another user's
                dead[pid] = False
        path = os.path.join(HANDOVER_DIR, name)
        try:
            if dead[pid] and os.lstat(path).st_uid == os.getuid():
                os.unlink(path)
        except OSError:
            pass


def _remove_leftovers(prefix: str) -> None:
    if not HANDOVER_DIR:
        return
    try:
        names = [n for n in os.listdir(HANDOVER_DIR) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(HANDOVER_DIR, name))
        except OSError:
            pass


class _Handover:
    """A result on its way to the parent, in the file `path`: `pickled` is (offset, length) of the protocol-5 pickle
    without its arrays; `arrays` has, for each out-of-band array in order, either its bytes (a small one, here) or
    its (offset, length) in the file."""

    __slots__ = ("path", "pickled", "arrays")

    def __init__(self, path: str | None, pickled, arrays: list):
        self.path, self.pickled, self.arrays = path, pickled, arrays

    def __reduce__(self):
        return _Handover, (self.path, self.pickled, self.arrays)


def _pack(value, prefix: str):
    """In the child: `value` itself (the pool's pipe pickles it as before) when it is small, cannot be pickled or no
    file can be written; otherwise a _Handover whose arrays are in a new file of HANDOVER_DIR."""
    if not HANDOVER_DIR or value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    buffers: list[pickle.PickleBuffer] = []
    try:
        pickled = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception:  # noqa: BLE001 - the pipe's pickling raises it again, where the pool reports it
        return value
    views = [b.raw() for b in buffers]
    if sum(v.nbytes for v in views) < HANDOVER_MIN_BYTES:
        return value
    layout: list = []
    end = 0
    for view in views:
        if view.nbytes < _ARRAY_FILE_MIN_BYTES:
            layout.append(bytearray(view))  # writable, as an array unpickled from the pipe is
        else:
            layout.append((end, view.nbytes))
            end += -(-view.nbytes // _PAGE) * _PAGE  # page-aligned: each array is mapped on its own (where an
            # array starts does not change the time to unpickle and read it: 8 B, 64 B and 4 KiB measured alike)
    pickled_at = (end, len(pickled))
    end += len(pickled)
    path = os.path.join(HANDOVER_DIR, f"{prefix}{os.getpid()}-{next(_CONTEXTS)}")
    try:
        room = os.statvfs(HANDOVER_DIR)
        if room.f_bavail * room.f_frsize < end + (64 << 20):  # leave the rest of shared memory to others
            return value
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:  # no such directory, not writable
        return value
    try:
        try:
            for place, view in zip(layout, views):
                if isinstance(place, tuple):
                    _write_all(fd, view, place[0])
            _write_all(fd, memoryview(pickled), pickled_at[0])
        finally:
            os.close(fd)
    except OSError:  # full (ENOSPC): the pipe takes it
        os.unlink(path)
        return value
    return _Handover(path, pickled_at, layout)


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    view = view.cast("B")
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _unpack(value):
    """In the parent: the result a child's _pack gave."""
    if not isinstance(value, _Handover):
        return value
    fd = os.open(value.path, os.O_RDONLY)
    try:
        os.unlink(value.path)
        arrays = [memoryview(mmap.mmap(fd, place[1], access=mmap.ACCESS_COPY, offset=place[0]))
                  if isinstance(place, tuple) else place for place in value.arrays]
        start, length = value.pickled  # start: a page, after the arrays
        pickled = mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=start)
    finally:
        os.close(fd)
    view = memoryview(pickled)
    try:
        return pickle.loads(view, buffers=arrays)
    finally:
        view.release()
        pickled.close()


def _packed(prefix: str, function: Callable, *args):
    """A pool's task: function(*args), its result packed for the way back."""
    return _pack(function(*args), prefix)


def _unpacked(future: Future) -> Future:
    """A Future of what `future` (a pool's Future of a _packed call) gives once unpacked. The unpacking runs as soon as
    the result arrives, taken or not, so that the file is removed at once."""
    outer: Future = Future()

    def arrived(inner: Future) -> None:
        if inner.cancelled():
            Future.cancel(outer)
            outer.set_running_or_notify_cancel()  # tells wait() as well
            return
        err = inner.exception()
        if err is not None:
            outer.set_exception(err)
            return
        try:
            outer.set_result(_unpack(inner.result()))
        except BaseException as unpack_err:  # noqa: BLE001 - the caller's result() raises it
            outer.set_exception(unpack_err)

    outer.cancel = future.cancel  # cancelling the task before it runs cancels both (via arrived)
    future.add_done_callback(arrived)
    return outer


def _ignore_interrupts(parent: int | None = None) -> None:
    """In a forked child, first: Ctrl-C is the parent's; and the child ends when `parent` does (_die_with_parent)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while forking (_workers); now ignored
    if parent is not None:
        _die_with_parent(parent)


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In a forked child: end when the parent ends, however it ends (SIGKILL too), instead of waiting for ever on
    its pipe: Linux sends SIGTERM at the parent's death (PR_SET_PDEATHSIG); then the handover files of the dead
    parent, which no one else would remove, are removed. A SIGTERM while the parent lives (it ends its workers) ends
    the child as before."""
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return

    def ended(signum, _frame) -> None:
        if os.getppid() != parent:
            _remove_leftovers(f"pcapdecomp-{parent}-")
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, ended)
    if os.getppid() != parent:  # the parent died before the request was made
        ended(signal.SIGTERM, None)


@contextmanager
def worker_pool(count: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of `count` forked workers. Ctrl-C is the parent's to handle: the terminal sends SIGINT to the whole
    process group, and a worker that took it would die mid-task with its own traceback (the parent then sees a
    broken pool, not an interrupt). When the parent stops early (Ctrl-C, a worker's error) the workers are ended
    at once instead of finishing their captures (also when the memory bound stops the run)."""
    before = set(mp.active_children())
    pool = ProcessPoolExecutor(max_workers=count, mp_context=mp.get_context("fork"), initializer=_ignore_interrupts,
                               initargs=(os.getpid(),))
    prefix = _handover_prefix()
    try:
        yield _BlockingInterruptsWhileForking(pool, prefix)
    except (KeyboardInterrupt, MemoryBoundError):  # the memory bound: a worker left to finish would pass it
        # A worker ended mid-result can leave the pool's manager thread waiting on a half-sent message for ever,
        # and interpreter exit joins that thread: after an interrupt the CLI leaves with os._exit (cli.main).
        pool.shutdown(wait=False, cancel_futures=True)
        ended = set(mp.active_children()) - before
        for child in ended:
            child.terminate()
        for child in ended:  # gone before their files are looked for: none is written afterwards
            child.join(2)
            if child.is_alive():  # its SIGTERM handler is Python: it waits for the C reader's chunk to end
                child.kill()
                child.join()
        raise
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        _remove_leftovers(prefix)


class _BlockingInterruptsWhileForking:
    """The pool's submit with SIGINT blocked: the first submit forks every worker, and a Ctrl-C that lands inside
    fork's at-fork hooks would be swallowed there ("Exception ignored"), in the parent as in the child. Blocked, it
    waits until the workers exist (they inherit the mask and ignore it before unblocking) and then interrupts the
    parent where it stands."""

    def __init__(self, pool: ProcessPoolExecutor, prefix: str):
        self._pool = pool
        self._prefix = prefix

    def submit(self, function: Callable, *args) -> Future:
        """A Future of function(*args), run in a worker; its result comes back by the handover (_pack)."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return _unpacked(self._pool.submit(_packed, self._prefix, function, *args))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def default_jobs() -> int:
    """Cores this process may use (its CPU affinity), at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))



def run_all(function: Callable, calls: list[tuple], jobs: int) -> list:
    """function(*call) for every call, in up to `jobs` forked processes (in this one when jobs is 1 or there is
    a single call); results in the order of `calls`, a worker's exception re-raised here."""
    if jobs <= 1 or len(calls) <= 1:
        return [function(*call) for call in calls]
    with worker_pool(min(jobs, len(calls))) as pool:
        return [f.result() for f in [pool.submit(function, *call) for call in calls]]


class Ahead:
    """Calls started on forked workers before their results are wanted, so they run while this process does other
    work (analysis: the clock's segment pass over each capture while the parent pairs the captures and repairs
    their losses). With one job nothing starts ahead (`start_all` returns None): the caller runs the call when it needs
    it. A context: leaving it ends the workers (after their calls; at once on Ctrl-C)."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self._context = None
        self._pool = None

    def __enter__(self) -> "Ahead":
        return self

    def start_all(self, function: Callable, calls: list[tuple]) -> list | None:
        """A Future of function(*call) for every call, on up to `jobs` - 1 workers forked now: this process goes on
        working meanwhile and keeps a core for it (with --jobs 2, one worker reads the points one after the other).
        None with one job (or no call). Once per Ahead."""
        if self.jobs <= 1 or not calls:
            return None
        if self._pool is not None:
            raise RuntimeError("Ahead.start_all runs once")
        self._context = worker_pool(min(self.jobs - 1, len(calls)))
        self._pool = self._context.__enter__()
        return [self._pool.submit(function, *call) for call in calls]

    def end(self) -> None:
        """End the workers now, after their calls (the caller took or no longer wants the results). A forked worker
        left alive while this process goes on makes this process's first write to each page it had at the fork a
        copy of that page (copy-on-write): with the worker alive to the end, the stages after the clock paid that
        on every page of the heap they reused. Leaving the context afterwards does nothing more."""
        self.__exit__(None, None, None)

    def __exit__(self, *exc) -> bool:
        context, self._context, self._pool = self._context, None, None
        return bool(context is not None and context.__exit__(*exc))


class Worker:
    """One forked worker for several calls, run there in the order given: a call may leave what it made in the worker
    (a module's variable) for the next one (repair: a capture's scan, made for the bytes it gives the other point,
    kept for its own re-read). A context: leaving it ends the worker (after its calls; at once on Ctrl-C)."""

    def __enter__(self) -> "Worker":
        self._context = worker_pool(1)
        self._pool = self._context.__enter__()
        return self

    def submit(self, function: Callable, *args):
        """A Future of function(*args), run after the calls submitted before it."""
        return self._pool.submit(function, *args)

    def __exit__(self, *exc) -> bool:
        return bool(self._context.__exit__(*exc))


class Forked:
    """function(*args) in a child forked now. The child sees this process's memory as it is: nothing is pickled on
    the way in (a table of a million rows is shared, not copied), only the result on the way back. `result()` waits
    and returns it, or raises the child's exception here. Leaving the context before the result was taken (an error
    here, Ctrl-C) ends the child at once. Ctrl-C is the parent's to handle, as for the pools (_workers)."""

    def __init__(self, function: Callable, *args):
        context = mp.get_context("fork")
        self._receive, send = context.Pipe(duplex=False)
        self._prefix = _handover_prefix()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # see _BlockingInterruptsWhileForking
        try:
            self._process = context.Process(target=_call_and_send,
                                            args=(send, self._prefix, function, args, os.getpid()), daemon=True)
            self._process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        send.close()
        self._taken = False

    def __enter__(self) -> "Forked":
        return self

    def result(self):
        try:
            ok, value = self._receive.recv()
        except EOFError:
            ok, value = None, None
        finally:
            self._receive.close()
        self._taken = True  # not before: a Ctrl-C while waiting leaves __exit__ to end the child
        try:
            if ok:
                value = _unpack(value)
        finally:
            self._process.join()
            _remove_leftovers(self._prefix)
        if ok is None:
            raise RuntimeError(f"a forked process ended without its result (exit code {self._process.exitcode})")
        if not ok:
            raise value
        return value

    def __exit__(self, *exc) -> bool:
        if not self._taken:
            self._process.terminate()
            self._process.join()
            self._receive.close()
            _remove_leftovers(self._prefix)
        return False


def _call_and_send(send, prefix: str, function: Callable, args: tuple, parent: int) -> None:
    """Forked's child: the call, and its result (packed for the way back, _pack) or exception sent back (one that
    cannot be pickled, as its text)."""
    _ignore_interrupts(parent)
    try:
        outcome = (True, _pack(function(*args), prefix))
    except BaseException as err:  # noqa: BLE001 - it is the parent's to raise
        outcome = (False, err)
    try:
        send.send(outcome)
    except Exception:  # noqa: BLE001 - a result or an exception pickle does not take
        send.send((False, RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]}")))
    send.close()


def run_beside(function: Callable, calls: list[tuple], jobs: int, here: Callable) -> tuple[object, list]:
    """(here(), [function(*call) for every call]): the calls in up to `jobs` − 1 forked processes while `here` runs
    in this one (so two passes over two files overlap); all in this process, one after the other, when jobs is 1
    or there is no call."""
    if jobs <= 1 or not calls:
        return here(), [function(*call) for call in calls]
    with worker_pool(min(jobs - 1, len(calls))) as pool:
        futures = [pool.submit(function, *call) for call in calls]
        mine = here()
        return mine, [f.result() for f in futures]
