"""Hostile input cannot make time or memory explode: each adversarial input is scaled 4× and the growth of the
work (Python lines executed in pcapdecomp, or CPU time where the work is inside C: regexes, numpy) and of the peak
memory is asserted. Quadratic work would grow 16×; the bounds below allow linear (or n log n) with noise.

The inputs are crafted captures (tests/craft.py) and statements, each reproducing a case of issue 16: unanswered
requests, requests packed into one compressed packet, bare ACKs, out-of-order segments, ReDoS in the fingerprint.
"""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from craft import ACK, Capture, Conversation, packed_commands
from lanes import extract_with

from pcapdecomp.core import fingerprint as fp
from pcapdecomp.read.exchanges import extract
from pcapdecomp.read.tcp import HalfStream, HeldBudget

PACKAGE = str(Path(fp.__file__).resolve().parents[1])  # the whole package, every stage of it


def lines_run(fn) -> int:
    """Lines of pcapdecomp's Python code executed by fn(): a count of work that load on the machine cannot move."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def call(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(PACKAGE) else None

    old = sys.gettrace()
    sys.settrace(call)
    try:
        fn()
    finally:
        sys.settrace(old)
    return count


def cpu_time(fn, repeat: int = 3) -> float:
    """Best of `repeat` runs of fn(), process CPU seconds (for work done in C, which lines_run cannot see)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def peak_memory(fn) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- captures ------------------------------------------------------------------------------------------------


def unanswered(path: Path, n: int) -> Path:
    """A login, then n COM_QUERYs whose answers were not captured."""
    cap = Capture()
    conn = Conversation(cap).open().login()
    for i in range(n):
        conn.query(b"SELECT %d" % i, answer=None)
    conn.close()
    return cap.write(path)


def bare_acks(path: Path, n: int) -> Path:
    """A connection that carries nothing but n ACKs (issue 16: 3 M of them, 713 KB gzipped, took 1.1 GB)."""
    cap = Capture()
    conn = Conversation(cap).open()
    for i in range(n):
        conn._frame(True, ACK, ack=conn.sseq + i)
    return cap.write(path)


@pytest.mark.parametrize("make", [unanswered, packed_commands], ids=lambda f: f.__name__)
def test_unanswered_requests_cost_linear_work(tmp_path, make):
    """Issue 16: 40,000 requests whose answers were not captured took 150 s (2 s answered): every new request
    scanned the queue of those waiting."""
    small, large = make(tmp_path / "small.pcap", 500), make(tmp_path / "large.pcap", 2000)
    work_small = lines_run(lambda: extract_with(small, False))
    work_large = lines_run(lambda: extract_with(large, False))
    assert work_large < 4.6 * work_small, (work_small, work_large)
    x = extract(large)
    assert (x.exchanges["problems"] == "unanswered").sum() == 2000


def test_bare_acks_cost_no_memory(tmp_path):
    small, large = bare_acks(tmp_path / "small.pcap", 4_000), bare_acks(tmp_path / "large.pcap", 16_000)
    peaks = [peak_memory(lambda p=p: extract_with(p, False)) for p in (small, large)]
    assert peaks[1] < peaks[0] + (256 << 10), peaks  # not 4x: nothing is kept per ACK
    q = extract(large).quality()
    assert q["frames_tcp"] == q["frames_tcp_other"] == 16_003  # every frame still counted


# --- TCP reassembly ---------------------------------------------------------------------------------------------


def one_byte_segments(n: int, order: str, stream: HalfStream | None = None) -> HalfStream:
    """n one-byte segments after a hole at offset 0, in `order`, then the hole: issue 16's 400,000 took 28 s."""
    half = stream or HalfStream()
    half.syn(0)
    if order == "forward":
        seqs = range(2, n + 2)
    elif order == "reverse":
        seqs = range(n + 1, 1, -1)
    else:  # every other byte, then the ones between
        seqs = [*range(3, 2 * n + 2, 2), *range(4, 2 * n + 2, 2)]
    for s in seqs:
        half.segment(s, b"x", s, s)
    half.segment(1, b"y", 0, 0)
    half.flush(0)
    return half


@pytest.mark.parametrize("order", ["forward", "reverse", "alternate"])
def test_out_of_order_segments_cost_linear_work(order):
    work = [lines_run(lambda n=n: one_byte_segments(n, order)) for n in (1500, 6000)]
    assert work[1] < 4.6 * work[0], work
    # what the Python lines cannot see: moving list items in C (a pop from the front of a long list per segment)
    n = 12_500 if order == "alternate" else 25_000  # alternate sends 2n segments
    cpu = [cpu_time(lambda n=n: one_byte_segments(n, order)) for n in (n, 4 * n)]
    assert cpu[1] < 7.5 * cpu[0], cpu


def test_caps_on_held_data_bite_counted():
    """Per direction at most max_segments segments wait; across connections at most the budget's bytes (plus one
    segment). When a cap bites, the hole is declared a gap and counted as forced."""
    half = one_byte_segments(10_000, "reverse")
    assert half.stats.forced_gaps > 0 and half.stats.forced_gaps <= half.stats.gaps
    assert half.next == 10_001 + 1 or half.stats.gap_bytes > 0

    budget = HeldBudget(limit=64 << 10)
    peak = 0
    halves = []
    for i in range(50):  # 50 connections, each holding 16 KiB after a hole
        half = HalfStream(budget=budget)
        half.syn(0)
        halves.append(half)
        for k in range(16):
            half.segment(1001 + k * 1024, b"z" * 1024, k, k)
            peak = max(peak, budget.held)
    assert peak <= (64 << 10) + 1024
    assert budget.forced_gaps > 0
    assert budget.held == sum(h.buffered for h in halves)


# --- fingerprints -----------------------------------------------------------------------------------------------

def words(n: int) -> list[str]:
    """n distinct lowercase words without digits (digits would be abstracted to "?" and make them equal)."""
    out = []
    for i in range(n):
        word = ""
        while True:
            word += chr(97 + i % 26)
            i //= 26
            if not i:
                break
        out.append(word)
    return out


ADVERSARIAL = {
    "unclosed comments": lambda n: "select " + "/*a" * (n // 3),
    "one-line comments before a quote": lambda n: "select " + "#" * n + "'",
    "double-dash comments": lambda n: "select " + "--" * (n // 2) + "'",
    "VALUES( without a row boundary": lambda n: "INSERT INTO t VALUES(" * (n // 22) + ")" * (n // 22),
    "selects, one union": lambda n: "select " * (n // 7) + " union",
    "distinct unions": lambda n: "select " + " union select ".join(words(n // 18)),
    "alternating unions": lambda n: "select x union select " + " union select x union select ".join(words(n // 32)),
    "repeated unions": lambda n: " union ".join(["select a"] * (n // 15)),
    "vertical tabs after ORDER BY": lambda n: "select * from t order by a" + "\v" * n + "b asc",
}


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_fingerprint_cost_is_linear(name):
    """Issue 16: a 43 KB capture took 68 s to fingerprint; at the 1 MiB statement cap, hours."""
    make = ADVERSARIAL[name]
    small, large = make(1 << 15), make(1 << 17)
    cpu = [cpu_time(lambda q=q: fp.digest_fingerprint(q), 2) for q in (small, large)]
    assert cpu[1] < 8 * cpu[0] + 0.02, cpu
    assert cpu[1] < 1.0, cpu
