"""Lab recordings made once per test session by the tests that need them (not committed: they are a few MB).

`two_servers()` records the lab's `two-servers` scenario: a primary and a replica on hosts of their own, each
captured there, the app host captured on both of its links, every tcpdump rotating its file each million bytes
(`tcpdump -C 1`): app/, db/ and db-replica/ with 2–3 files each. It needs root and `ip netns`; elsewhere the tests
skip, except in CI (CI=true), where a skip would hide a broken lab, so they fail."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def lab_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root: the lab needs network namespaces and tcpdump"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is unavailable on this machine"
    return None


def require_lab() -> None:
    reason = lab_unavailable_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the lab must run in CI but cannot: {reason}")
        pytest.skip(reason)


@functools.lru_cache(maxsize=None)
def _record(scenario: str) -> Path:
    sys.path.insert(0, str(REPO / "captures" / "lab"))
    import record as lab_record

    folder = Path(tempfile.mkdtemp(prefix=f"pcd-{scenario}-"))
    atexit.register(shutil.rmtree, folder, True)
    return lab_record.record(scenario, folder / scenario, install=False)


def two_servers() -> Path:
    require_lab()
    return _record("two-servers")
