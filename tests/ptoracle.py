"""percona-toolkit as an oracle for tests: `PtOracle(tool)` is one long-lived Perl process
(tests/data/fingerprint/pt_oracle.pl) that loads the installed pt-fingerprint or pt-query-digest and streams queries
through its own QueryRewriter::fingerprint, so hundreds of queries cost one Perl start. PT_FINGERPRINT,
PT_QUERY_DIGEST and PERL are None when the tool is not installed (the tests that need it are skipped)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ORACLE_SCRIPT = Path(__file__).parent / "data" / "fingerprint" / "pt_oracle.pl"
PT_FINGERPRINT = shutil.which("pt-fingerprint")
PT_QUERY_DIGEST = shutil.which("pt-query-digest")
PERL = shutil.which("perl")


def query_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def query_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


class PtOracle:
    """One long-lived Perl process running percona-toolkit's QueryRewriter::fingerprint."""

    def __init__(self, tool: str, **options: bool) -> None:
        args = [PERL, str(ORACLE_SCRIPT), tool] + [f"{k}={int(v)}" for k, v in options.items()]
        self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def __call__(self, query: str) -> str:
        data = query_bytes(query)
        self._proc.stdin.write(b"%d\n" % len(data) + data)
        self._proc.stdin.flush()
        header = self._proc.stdout.readline()
        assert header, f"pt oracle exited with {self._proc.wait()}"
        status, length = header.split()
        body = self._proc.stdout.read(int(length))
        if status != b"OK":
            raise AssertionError(f"percona-toolkit died on {query!r}: {query_text(body)}")
        return query_text(body)

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=30)
        self._proc.stdout.close()
