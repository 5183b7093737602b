"""What a run leaves behind when it cannot clean up: workers die with their parent (SIGKILL of the parent
included), the handover files of dead parents are removed (by the dying workers, and at the next run's start), and
a full disk is one line, not an internal error. On the bundled captures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOGS = REPO / "captures" / "oltp-hogs"
GROUP_STALL = REPO / "captures" / "group-stall"


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("delay", [0.2, 0.6])
def test_workers_die_with_a_killed_parent_and_leave_no_file(tmp_path, delay):
    shm = tmp_path / "shm"
    shm.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(HOGS), "--jobs", "2",
                             "--out", str(tmp_path / "o"), "-q"], cwd=REPO, start_new_session=True,
                            env={**os.environ, "PCAPDECOMP_HANDOVER_DIR": str(shm)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    workers: list[int] = []
    while not workers:
        assert proc.poll() is None and time.monotonic() < deadline
        workers = children_of(proc.pid)
        time.sleep(0.01)
    time.sleep(delay)
    workers = children_of(proc.pid) or workers
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(w) for w in workers)
    assert list(shm.iterdir()) == []


def test_stale_handover_files_of_dead_processes_are_removed_at_start(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (shm / f"pcapdecomp-{gone.pid}-0-table").write_bytes(b"x" * 4096)  # its process is gone
    (shm / f"pcapdecomp-{os.getpid()}-0-table").write_bytes(b"y")  # a live process's: not ours to remove
    (shm / "other-file").write_bytes(b"z")
    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(GROUP_STALL), "--jobs", "2",
                           "--out", str(tmp_path / "o"), "-q"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PCAPDECOMP_HANDOVER_DIR": str(shm)}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in shm.iterdir()) == sorted([f"pcapdecomp-{os.getpid()}-0-table", "other-file"])


def test_a_full_disk_is_one_line_not_an_internal_error(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): " + mounted.stderr.decode().strip())
    try:
        done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(GROUP_STALL), "--out",
                               str(full / "o"), "-q"], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "no space left on the device" in lines[0]
        assert not (full / "o").exists()  # the run made the folder: nothing of it stays
    finally:
        subprocess.run(["umount", str(full)])
