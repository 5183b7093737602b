"""`pcapdecomp lab record`: runs the lab scripts in captures/lab/ of the source checkout.

The lab is a set of scripts, not part of the installed package (it needs root, network namespaces and a MariaDB
server); this wrapper finds it next to the package and turns its errors into pcapdecomp errors.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .errors import PcapdecompError, UsageError

LAB_DIR = Path(__file__).resolve().parents[1] / "captures" / "lab"


class LabFailed(PcapdecompError):
    """The lab could not record (not root, no netns, a tool missing, the workload failed)."""


def _load_record_module():
    script = LAB_DIR / "record.py"
    if not script.exists():
        raise UsageError(f"the lab scripts are not here ({LAB_DIR}); run from a source checkout of pcapdecomp")
    sys.path.insert(0, str(LAB_DIR))
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
