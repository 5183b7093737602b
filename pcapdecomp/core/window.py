"""`analyze --since T --until T`: the time window of long captures an analysis keeps (issue 37).

Every capture is still read whole, so that what a connection learnt before the window (its greeting and
connection id, its prepared statements, TLS and compression) is known inside it; only the exchanges whose
request's first byte (req_first_ts: A1 at an app point, D1 at a DB point) falls in [since, until) are kept, each
point by its own capture clock. The request decides because it is the instant the exchange's time starts from:
the slow log's and the thread pool's view of a statement begin there (the pool queues a request when it arrives),
and a statement sent in the window is kept whole even when its answer ends after it, as an incident's last
statements should be. The rows are dropped as the extraction makes its record batches (read/exchanges.py), so
memory follows the window, not the capture."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from .errors import UsageError

NS = 1_000_000_000
# The clock's samples and the holes the loss repair fills are kept this far beyond each end of the window, by the
# point's own clock: an exchange at the window's edge has its twin at the other point up to the offset between the
# two clocks plus the network's one-way time away (microseconds to milliseconds with NTP), and a clock fit with
# samples on both sides of the window's edges does not extrapolate its line there. A second covers offsets a
# thousand times those of an NTP-kept pair and costs a second of segments at each end.
MARGIN_NS = NS

_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?"
                  r"\s*(Z|UTC|[+-]\d{2}(?::?\d{2})?)?", re.IGNORECASE)
_EPOCH = re.compile(r"\d{9,11}(?:\.\d{1,9})?")


def parse_instant(text: str, zone: dt.tzinfo, option: str) -> int:
    """An instant as a DBA has it at hand → ns since the epoch: ISO 8601 with or without a zone
    ("2026-11-27T10:00:06Z", "2026-11-27 11:00:06+01:00", "2026-11-27 10:00:06.25": a time without a zone is in
    `zone`, the run's --slow-log-tz, else UTC), or epoch seconds ("1795773606", "1795773606.25"). Anything else is a
    UsageError naming `option`."""
    given = text.strip()
    if _EPOCH.fullmatch(given):
        whole, _, fraction = given.partition(".")
        return int(whole) * NS + int((fraction or "0").ljust(9, "0"))
    m = _ISO.fullmatch(given)
    if m is None:
        raise UsageError(f"{option} {text!r}: expected an ISO 8601 time (2026-11-27T10:00:06, with a zone like Z or "
                         "+01:00 or without one) or epoch seconds (1795773606)")
    year, month, day, hour, minute = (int(m[i]) for i in range(1, 6))
    second, fraction, offset = int(m[6] or 0), m[7] or "", m[8]
    if offset is None:
        tz = zone
    elif offset.upper() in ("Z", "UTC"):
        tz = dt.timezone.utc
    else:
        digits = offset[1:].replace(":", "")
        minutes = int(digits[:2]) * 60 + int(digits[2:] or 0)
        tz = dt.timezone((1 if offset[0] == "+" else -1) * dt.timedelta(minutes=minutes))
    try:
        local = dt.datetime(year, month, day, hour, minute, second)
    except ValueError as err:
        raise UsageError(f"{option} {text!r}: {err}") from None
    # a zone with daylight saving (Europe/Berlin): the first of an hour that happens twice (fold 0)
    return int(local.replace(tzinfo=tz).timestamp()) * NS + int(fraction.ljust(9, "0") or 0)


def iso_text(ns: int) -> str:
    """An instant as ISO 8601 in UTC, to the microsecond where it has one."""
    seconds, rest = divmod(ns, NS)
    text = dt.datetime.fromtimestamp(seconds, dt.timezone.utc).replace(tzinfo=None).isoformat()
    if rest:
        text += f".{rest:09d}".rstrip("0")
    return text + "Z"


@dataclass(frozen=True)
class Window:
    """The kept time window: [since_ns, until_ns), either end open (None)."""

    since_ns: int | None
    until_ns: int | None

    @property
    def length_ns(self) -> int | None:
        return None if self.since_ns is None or self.until_ns is None else self.until_ns - self.since_ns

    def text(self) -> str:
        """The window in words, for messages: "2026-11-27T10:00:06Z … 2026-11-27T10:00:16Z"."""
        return (f"{iso_text(self.since_ns) if self.since_ns is not None else 'the captures’ start'} … "
                f"{iso_text(self.until_ns) if self.until_ns is not None else 'their end'}")

    def kept(self, rows, reached=None):
        """The rows of an Arrow record batch of exchanges whose req_first_ts is in the window; `reached(ns)` is told
        the batch's latest request (how far into the capture its reading is: core.memory's extrapolation)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        ts = rows.column("req_first_ts").cast(pa.int64())
        if reached is not None and len(ts):
            latest = pc.max(ts).as_py()
            if latest is not None:
                reached(latest)
        inside = None
        if self.since_ns is not None:
            inside = pc.greater_equal(ts, self.since_ns)
        if self.until_ns is not None:
            before = pc.less(ts, self.until_ns)
            inside = before if inside is None else pc.and_(inside, before)
        return rows.filter(inside)

    def holes_in(self, holes: list) -> list:
        """The holes (tcp.HalfStream.holes: raw seq, length, ns when found) found in the window or its margin: the
        loss repair fills those; one outside is of exchanges the analysis does not keep."""
        lo, hi = self.around()
        return [h for h in holes if lo <= h[2] <= hi]

    def around(self) -> tuple[int, int]:
        """The window with MARGIN_NS on each side, as (lo, hi) ns (an open end: the int64 range)."""
        return (self.since_ns - MARGIN_NS if self.since_ns is not None else -(1 << 63),
                self.until_ns + MARGIN_NS if self.until_ns is not None else (1 << 63) - 1)

    def meets(self, first_ns: int | None, last_ns: int | None) -> bool:
        """A capture from `first_ns` to `last_ns` has some time in the window."""
        if first_ns is None or last_ns is None:
            return False
        return ((self.until_ns is None or first_ns < self.until_ns)
                and (self.since_ns is None or last_ns >= self.since_ns))

    def summary(self) -> dict:
        """summary.json → window."""
        return {"since": iso_text(self.since_ns) if self.since_ns is not None else None,
                "until": iso_text(self.until_ns) if self.until_ns is not None else None,
                "decided_by": "req_first_ts",
                "margin_s": MARGIN_NS / NS}


def window_of(since: str | None, until: str | None, zone: dt.tzinfo) -> Window | None:
    """--since and --until as a Window (None when neither is given); an empty or reversed window is a
    UsageError."""
    if since is None and until is None:
        return None
    window = Window(None if since is None else parse_instant(since, zone, "--since"),
                    None if until is None else parse_instant(until, zone, "--until"))
    if window.length_ns is not None and window.length_ns <= 0:
        raise UsageError(f"--since {since} is not before --until {until} ({window.text()}): the window is "
                         f"{'empty' if window.length_ns == 0 else 'reversed'}")
    return window
