"""Feeding pcapdecomp.mysql.connection.MySQLConnection in tests: a bundled recording's connections as the
reassembler delivers them (`chunks_of`: (direction, Chunk) in capture order, `run` feeds them whole), one of the
features recording's connections by what it does (`by_label`), and a connection after a real recorded handshake
that a test then feeds hand-built bytes (`established(handshake())`, through a `Feeder`)."""

from __future__ import annotations

from streams import FIN, SYN, recorded

from pcapdecomp.mysql.connection import CLIENT, SERVER, MySQLConnection
from pcapdecomp.read.tcp import Chunk, HalfStream


# ---- real connections as in-order chunks ------------------------------------------------------------------------------------
def chunks_of(name: str) -> list[tuple[tuple, list[tuple[int, Chunk]]]]:
    """Every connection of a lab recording as the reassembler delivers it: (direction, Chunk) in capture order."""
    out = []
    for (client, server), segs in sorted(recorded(name).items()):
        halves = {client: HalfStream(), server: HalfStream()}
        events = []
        for seg in segs:
            src = (seg.src_ip, seg.src_port)
            half = halves[src]
            if seg.flags & SYN:
                half.syn(seg.seq)
            for ev in half.segment(seg.seq, seg.payload, seg.ts_ns, seg.frame, bool(seg.flags & FIN)):
                events.append((CLIENT if src == client else SERVER, ev))
        out.append(((client, server), events))
    return out


def run(events, midstream=False, **kwargs) -> tuple[list, MySQLConnection]:
    conn = MySQLConnection(midstream=midstream, **kwargs)
    for direction, ev in events:
        if isinstance(ev, Chunk):
            conn.data(direction, ev.data, ev.ts_ns, ev.frame, ev.offset)
        else:
            conn.gap(direction, ev.length, ev.ts_ns)
    conn.end()
    return conn.take(), conn


_CHUNKS: dict[str, list] = {}


def chunks_of_cached(name):
    if name not in _CHUNKS:
        _CHUNKS[name] = chunks_of(name)
    return _CHUNKS[name]


def by_label(label: str):
    """The features connection whose exchanges include `needle` (the truth file names each connection's feature)."""
    for key, events in chunks_of_cached("features"):
        exchanges, conn = run(events)
        if any(label in (ex.sql or "") for ex in exchanges):
            return key, events, exchanges, conn
    raise AssertionError(label)


# ---- a hand-fed connection ------------------------------------------------------------------------------------------
class Feeder:
    """Feed hand-built bytes to a MySQLConnection with increasing times and per-direction offsets."""

    def __init__(self, conn: MySQLConnection):
        self.conn = conn
        self.offsets = [0, 0]
        self.ts = 1_000_000_000
        self.frame = 0

    def send(self, direction: int, data: bytes, step: int | None = None) -> None:
        step = step or len(data) or 1
        for i in range(0, len(data), step):
            piece = data[i : i + step]
            self.ts += 1000
            self.frame += 1
            self.conn.data(direction, piece, self.ts, self.frame, self.offsets[direction])
            self.offsets[direction] += len(piece)

    def gap(self, direction: int, length: int) -> None:
        self.ts += 1000
        self.conn.gap(direction, length, self.ts)
        self.offsets[direction] += length

    def take(self):
        return self.conn.take()


def established(events) -> tuple[MySQLConnection, Feeder]:
    """A MySQLConnection that has gone through a real recorded handshake (greeting, login, OK)."""
    conn = MySQLConnection()
    feeder = Feeder(conn)
    for direction, ev in events:
        if conn.phase == "command":
            break
        feeder.send(direction, ev.data)
    assert conn.phase == "command"
    feeder.take()
    return conn, feeder


def handshake():
    key, events, _, _ = by_label("SELEC 1 FROM nowhere")
    return events
