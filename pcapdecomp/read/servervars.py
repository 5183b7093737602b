"""The server's settings as a file: what `mysql -B -e "SHOW GLOBAL VARIABLES"` prints (--server-vars, a capture
set's variables.tsv), read into {"source": path, "values": {name: value}} for the playbook."""

from __future__ import annotations

import math
from pathlib import Path

from ..core.errors import InputError


MAX_VARS_BYTES = 4 << 20  # SHOW GLOBAL VARIABLES prints ~60 KiB


def read_server_vars(path: Path) -> dict:
    """{"source": path, "values": {name: value}} from `mysql -B -e "SHOW GLOBAL VARIABLES"` output: a header line
    Variable_name<TAB>Value, then one variable a line (numbers as numbers). Anything else: one line, exit 2."""
    try:
        if path.stat().st_size > MAX_VARS_BYTES:
            raise InputError(f"{path}: {path.stat().st_size:,} bytes: not SHOW GLOBAL VARIABLES output")
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    values: dict = {}
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and lines[0].split("\t")[0].strip().lower() == "variable_name":
        lines = lines[1:]
    for number, line in enumerate(lines, 1):
        name, tab, value = line.partition("\t")
        if not tab or not name.strip() or " " in name.strip():
            raise InputError(f"{path}: line {number}: not 'Variable_name<TAB>Value' (give what `mysql -B -e "
                             "\"SHOW GLOBAL VARIABLES\"` prints)")
        values[name.strip().lower()] = _value(value.strip())
    if not values:
        raise InputError(f"{path}: no variables (give what `mysql -B -e \"SHOW GLOBAL VARIABLES\"` prints)")
    return {"source": str(path), "values": values}


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            number = float(text)
            return number if math.isfinite(number) else text
        except ValueError:
            return text
