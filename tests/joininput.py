"""What decompose hands the slow-log join for a capture set: build_table's output, computed once per set by
running the analysis and keeping the table it passes to decompose."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

_TABLES: dict[Path, pd.DataFrame] = {}


def exchange_table(set_dir: Path) -> pd.DataFrame:
    if set_dir not in _TABLES:
        from pcapdecomp import analysis
        from pcapdecomp.explain import servers

        captured = {}
        real = servers.decompose

        def keep(table, *a, **k):
            captured["table"] = table.copy()
            return real(table, *a, **k)

        servers.decompose = keep
        try:
            with tempfile.TemporaryDirectory() as out:
                analysis.analyze(set_dir, analysis.Options(quiet=True), Path(out))
        finally:
            servers.decompose = real
        _TABLES[set_dir] = captured["table"]
    return _TABLES[set_dir]
