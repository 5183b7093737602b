"""`analyze --spill DIR` as a user in the field meets it (docs/partitioned.md §20): a DIR that fills up during the
run is one line naming DIR and the room the run needs, exit 2, nothing written, no spill file left (a full output
folder is still said as one); a DIR that is a file is said so; a SIGTERM in the middle of the run unwinds as a Ctrl-C
does: exit 143, the run's folder in DIR removed, the output folder as it was; a Ctrl-C with --scheduler local is one
line too. The tmpfs tests skip where `mount` is
not allowed; the SIGTERM test needs the 10 s read-write recording (skipped when absent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pcapdecomp.core.memory import size_text

from partitioning import CAPTURES, RECORDED, REPO


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp", "analyze", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=900)


@pytest.mark.parametrize("how", [["--jobs", "1"], ["--jobs", "2"], ["--jobs", "2", "--scheduler", "local"]])
def test_a_spill_folder_that_fills_up_is_one_line(small_tmpfs, how, tmp_path):
    """On a LocalCluster the workers' own log of the failed task (its traceback) is not printed either."""
    out = tmp_path / "out"
    done = cli(str(CAPTURES / "group-stall"), "-q", *how, "-o", str(out), "--spill", str(small_tmpfs))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    # DIR named, and the room: 60 % of the two captures' 114 KiB each
    size = sum((CAPTURES / "group-stall" / name).stat().st_size for name in ("app.pcap", "db.pcap"))
    assert f"--spill {small_tmpfs}: no space left" in lines[0]
    assert f"about {size_text(int(size * 0.6))} free there" in lines[0], lines[0]
    assert not out.exists()
    assert list(small_tmpfs.iterdir()) == []


def test_a_full_output_folder_is_not_blamed_on_the_spill(small_tmpfs, tmp_path):
    spill = tmp_path / "spill"
    done = cli(str(CAPTURES / "group-stall"), "-q", "--jobs", "1", "-o", str(small_tmpfs / "out"), "--spill",
               str(spill))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "choose another --out" in done.stderr, done.stderr
    assert not spill.exists()  # made by the run, left empty: removed


@pytest.mark.parametrize("made", [True, False])
def test_a_spill_folder_the_run_made_is_removed_an_existing_one_kept(made, tmp_path):
    """A --spill DIR that was not there (and the folders above it that were not) is removed again at the end, when
    the run left it empty; one that was there stays, however empty."""
    spill = tmp_path / "scratch" / "a" / "spill"
    if not made:
        spill.mkdir(parents=True)
    done = cli(str(CAPTURES / "group-stall"), "-q", "--jobs", "1", "-o", str(tmp_path / "out"), "--spill",
               str(spill))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "summary.json").exists()
    if made:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    else:
        assert list(spill.iterdir()) == []


def test_a_spill_folder_that_is_a_file_is_said_so(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    done = cli(str(CAPTURES / "group-stall"), "-q", "-o", str(tmp_path / "out"), "--spill", str(blocker))
    assert done.returncode == 2
    assert done.stderr.strip() == f"pcapdecomp: error: --spill {blocker}: is a file, not a folder"
    assert blocker.read_text() == "not a folder" and not (tmp_path / "out").exists()


def _as_a_shell_starts_it() -> None:
    """Ctrl-C at its default in the child, as an interactive shell starts a command (a test run in the background
    has SIGINT ignored, and an ignored SIGINT is inherited across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("sent, how, group", [
    (signal.SIGTERM, ["--jobs", "1"], False),  # kill PID
    (signal.SIGTERM, ["--jobs", "2"], True),  # a service manager: every process of the run
    (signal.SIGTERM, ["--jobs", "2", "--scheduler", "local"], True),
    (signal.SIGINT, ["--jobs", "2", "--scheduler", "local"], True),  # Ctrl-C: the terminal's whole group
])
def test_a_signal_in_the_middle_of_the_run(sent, how, group, tmp_path):
    """On a LocalCluster, Ctrl-C reaches its worker processes too: they print no KeyboardInterrupt of their own."""
    recording = RECORDED[0]
    if not (recording / "db.pcap").exists():
        pytest.skip(f"{recording} not recorded")
    spill, out = tmp_path / "spill", tmp_path / "out"
    spill.mkdir()
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    run = subprocess.Popen([sys.executable, "-m", "pcapdecomp", "analyze", "--db", str(recording / "db.pcap"), "-q",
                            *how, "-o", str(out), "--spill", str(spill)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
                           preexec_fn=_as_a_shell_starts_it)
    # the signal once the spill holds rows (not at a time: the run is in its extraction then, whatever the load)
    while run.poll() is None and not any(spill.glob("pcapdecomp-spill-*/**/*.arrows")):
        time.sleep(0.05)
    assert run.poll() is None, "the run ended before it spilled"
    if group:
        os.killpg(run.pid, sent)
    else:
        run.send_signal(sent)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 128 + sent, err
    said = "terminated" if sent == signal.SIGTERM else "interrupted"
    assert err.strip().splitlines() == [f"pcapdecomp: {said}"], err
    assert list(spill.iterdir()) == []
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


def test_a_second_ctrl_c_during_the_folders_removal_leaves_nothing(tmp_path, monkeypatch):
    """A double Ctrl-C: the second comes while the first one's clean-up removes the run's spill folder (a fresh pair
    of eyes pressed it twice 0.15 s apart on 4 copies of the read-write pair and found 406 MB left in the output
    folder). The removal ends first, then the interrupt; the DIR the run made goes too."""
    import shutil

    from pcapdecomp.run import spilled

    spill = tmp_path / "made" / "spill"
    folder = spilled.SpillFolder(spill)
    for i in range(20):
        (folder.path / f"bucket-{i}.arrows").write_bytes(bytes(4096))
    real_rmtree = shutil.rmtree

    def removing(path, **named):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C now, as the removal starts
        time.sleep(0.05)  # the handler runs here, between two bytecodes
        real_rmtree(path, **named)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises, as in the CLI
    try:
        monkeypatch.setattr(spilled.shutil, "rmtree", removing)
        with pytest.raises(KeyboardInterrupt):
            folder.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not folder.path.exists() and not (tmp_path / "made").exists()
