"""TLS secrets for decryption: an NSS key log file (--tls-keylog, or a capture set's tls-keys.log) and the
Decryption Secrets Blocks of pcapng captures (as `editcap --inject-secrets tls,KEYS` embeds them)."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

from ..core.errors import InputError
from ..mysql.tls import KeyLogError, merge_secrets, parse_keylog

KEYLOG_NAME = "tls-keys.log"  # a capture-set folder's client key log, picked up by this name
_DSB = 0x0000000A  # pcapng Decryption Secrets Block
_TLS_KEY_LOG = 0x544C534B  # its secrets type: "TLSK", an NSS key log
_SHB = 0x0A0D0D0A
_SCAN_BLOCKS = 64  # blocks looked at per file: secrets sit before the packets that need them


def read_keylog(path: Path) -> dict[bytes, dict[str, bytes]]:
    """A key log file; a missing, unreadable or malformed one is the user's mistake (one line)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise InputError(f"--tls-keylog {path}: {err.strerror or err}") from None
    try:
        secrets = parse_keylog(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"--tls-keylog {path}: not a text file (an NSS key log, as SSLKEYLOGFILE writes it)") from None
    except KeyLogError as err:
        raise InputError(f"--tls-keylog {path}: {err} (an NSS key log, as SSLKEYLOGFILE writes it)") from None
    return secrets


def pcapng_secrets(path: os.PathLike | str) -> dict[bytes, dict[str, bytes]]:
    """The TLS key logs in the Decryption Secrets Blocks near the start of a pcapng file (gzip or not); {} for
    other files, or when a block is damaged (the capture reader reports damage)."""
    out: dict[bytes, dict[str, bytes]] = {}
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or struct.unpack_from("<I", head)[0] != _SHB:
                return out
            magic = head[8:12]
            endian = "<" if magic == b"\x4d\x3c\x2b\x1a" else ">" if magic == b"\x1a\x2b\x3c\x4d" else None
            if endian is None:
                return out
            length = struct.unpack_from(endian + "I", head, 4)[0]
            f.seek(length)
            for _ in range(_SCAN_BLOCKS):
                block = f.read(8)
                if len(block) < 8:
                    break
                kind, length = struct.unpack(endian + "II", block)
                if length < 12 or length % 4:
                    break
                if kind != _DSB:
                    f.seek(length - 8, os.SEEK_CUR)
                    continue
                body = f.read(length - 8)
                if len(body) < 8:
                    break
                secrets_type, size = struct.unpack_from(endian + "II", body)
                if secrets_type == _TLS_KEY_LOG:
                    try:
                        out = merge_secrets(out, parse_keylog(body[8:8 + size].decode("utf-8", "replace")))
                    except KeyLogError:
                        continue
    except (OSError, EOFError, gzip.BadGzipFile, struct.error):
        return out
    return out


def load_secrets(keylogs: list[Path], captures: list) -> dict[bytes, dict[str, bytes]] | None:
    """Every secret the key log files and the captures' Decryption Secrets Blocks hold; None when there are none.
    `captures`: capture files, or capture points (sources.CapturePoint: their `files`)."""
    parts = [read_keylog(p) for p in keylogs]
    for capture in captures:
        for f in getattr(capture, "files", None) or [capture]:
            parts.append(pcapng_secrets(f))
    secrets = merge_secrets(*parts)
    return secrets or None
