"""`pcapdecomp lab record`: runs the lab scripts in captures/lab/ of the source checkout.

The lab is a set of scripts, not part of the installed package (it needs root, network namespaces and a MariaDB
server, and it writes into the checkout's captures/): a development command. This wrapper finds the scripts next to
the package (a checkout, or an editable install) or in the current folder (an installed copy run from a checkout's
root), and turns their errors into pcapdecomp errors.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .core.errors import PcapdecompError, UsageError

LAB_DIR = Path(__file__).resolve().parents[1] / "captures" / "lab"


def lab_dir() -> Path:
    """The lab scripts of a source checkout: beside the package, else under the current folder."""
    for folder in (LAB_DIR, Path.cwd() / "captures" / "lab"):
        if (folder / "record.py").is_file():
            return folder
    raise UsageError("`pcapdecomp lab record` is a development command: it runs the lab scripts of a source "
                     "checkout (captures/lab/), which an installed copy does not hold; run it from the root of a "
                     "checkout of pcapdecomp")


class LabFailed(PcapdecompError):
    """The lab could not record (not root, no netns, a tool missing, the workload failed)."""


def _load_record_module():
    folder = lab_dir()
    script = folder / "record.py"
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("pcapdecomp_lab_record", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_lab(scenario: str, out: Path | None, duration: float | None, seed: int | None, install: bool = True) -> Path:
    record = _load_record_module()
    try:
        return record.record(scenario, out, duration, seed if seed is not None else 1, install=install)
    except record.LabError as exc:
        raise LabFailed(str(exc)) from None
