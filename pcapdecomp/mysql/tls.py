"""TLS inside a MySQL connection, after the client's SSLRequest. Sans-IO.

`TlsSession.data(direction, bytes, ts, frame, offset)` takes each in-order chunk of one direction, frames TLS
records, reads the handshake for what decryption needs (the randoms, the version, the cipher suite) and returns
the connection's application data as events:

- `Plain`: decrypted application data (with the secrets of a key log for this session's client random), to be
  read by the MySQL parser as if it had been sent in the clear;
- `Sealed`: one application-data record that cannot be decrypted (no secrets for it): its size, times and stream
  offsets are known, its content is not.

Decryption covers the AEAD suites MySQL servers negotiate: TLS 1.3 (AES-128/256-GCM, ChaCha20-Poly1305) and
TLS 1.2 (ECDHE/DHE/RSA with AES-128/256-GCM, ECDHE with ChaCha20-Poly1305). The ciphers, HMAC and HKDF come from
the `cryptography` package; only the TLS key schedule (which secret, which label, which nonce) is written here.

Without secrets a TLS 1.3 session hides where its handshake ends: the server's records after its ServerHello up
to the client's first encrypted record are taken as handshake, and so are the client's encrypted records that
arrive in the frame of its first (its Finished, after an empty Certificate when the server asked for one: a TLS
stack writes them at once); every later record is application data (a NewSessionTicket or a closing alert then counts as data: a
few dozen bytes at the start and the end of a connection).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

CLIENT, SERVER = 0, 1
CHANGE_CIPHER_SPEC, ALERT, HANDSHAKE, APPLICATION_DATA = 20, 21, 22, 23
MAX_RECORD = (1 << 14) + 2048  # TLSCiphertext.length's limit (TLS 1.2; TLS 1.3's is lower)
# ServerHello.random of a HelloRetryRequest (RFC 8446 4.1.3): a second ClientHello and ServerHello follow
HELLO_RETRY_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")

# suite -> (AEAD, key bytes, hash); TLS 1.2 AES-GCM records carry an 8-byte explicit nonce, ChaCha20 ones do not
TLS13_SUITES = {0x1301: ("aes-gcm", 16, "sha256"), 0x1302: ("aes-gcm", 32, "sha384"),
                0x1303: ("chacha20", 32, "sha256")}
TLS12_SUITES = {
    0xC02F: ("aes-gcm", 16, "sha256"), 0xC030: ("aes-gcm", 32, "sha384"),  # ECDHE-RSA
    0xC02B: ("aes-gcm", 16, "sha256"), 0xC02C: ("aes-gcm", 32, "sha384"),  # ECDHE-ECDSA
    0x009E: ("aes-gcm", 16, "sha256"), 0x009F: ("aes-gcm", 32, "sha384"),  # DHE-RSA
    0x009C: ("aes-gcm", 16, "sha256"), 0x009D: ("aes-gcm", 32, "sha384"),  # RSA
    0xCCA8: ("chacha20", 32, "sha256"), 0xCCA9: ("chacha20", 32, "sha256"), 0xCCAA: ("chacha20", 32, "sha256"),
}
SUITE_NAMES = {
    0x1301: "TLS_AES_128_GCM_SHA256", 0x1302: "TLS_AES_256_GCM_SHA384", 0x1303: "TLS_CHACHA20_POLY1305_SHA256",
    0xC02F: "ECDHE-RSA-AES128-GCM-SHA256", 0xC030: "ECDHE-RSA-AES256-GCM-SHA384",
    0xC02B: "ECDHE-ECDSA-AES128-GCM-SHA256", 0xC02C: "ECDHE-ECDSA-AES256-GCM-SHA384",
    0x009E: "DHE-RSA-AES128-GCM-SHA256", 0x009F: "DHE-RSA-AES256-GCM-SHA384",
    0x009C: "AES128-GCM-SHA256", 0x009D: "AES256-GCM-SHA384",
    0xCCA8: "ECDHE-RSA-CHACHA20-POLY1305", 0xCCA9: "ECDHE-ECDSA-CHACHA20-POLY1305",
    0xCCAA: "DHE-RSA-CHACHA20-POLY1305",
}
KEYLOG_LABELS = ("CLIENT_RANDOM", "CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_HANDSHAKE_TRAFFIC_SECRET",
                 "CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0", "EXPORTER_SECRET",
                 "CLIENT_EARLY_TRAFFIC_SECRET", "EARLY_EXPORTER_SECRET")

Secrets = Mapping[bytes, Mapping[str, bytes]]  # client random -> key log label -> secret


class KeyLogError(ValueError):
    pass


def parse_keylog(text: str) -> dict[bytes, dict[str, bytes]]:
    """An NSS key log (SSLKEYLOGFILE's format: `LABEL <client random hex> <secret hex>` per line, '#' comments) as
    client random -> label -> secret. Lines of other labels (RSA, early-data secrets) are kept or skipped as they
    come; a line that is not of this format raises KeyLogError naming it."""
    out: dict[bytes, dict[str, bytes]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 3:
            raise KeyLogError(f"line {number} is not 'LABEL CLIENT_RANDOM SECRET'")
        label, random_hex, secret_hex = parts
        try:
            random, secret = bytes.fromhex(random_hex), bytes.fromhex(secret_hex)
        except ValueError:
            raise KeyLogError(f"line {number}: not hexadecimal") from None
        if label == "RSA":  # an encrypted pre-master secret: names no client random
            continue
        if len(random) != 32:
            raise KeyLogError(f"line {number}: a client random is 32 bytes, not {len(random)}")
        out.setdefault(random, {})[label] = secret
    return out


def merge_secrets(*sources: Secrets) -> dict[bytes, dict[str, bytes]]:
    out: dict[bytes, dict[str, bytes]] = {}
    for source in sources:
        for random, labels in source.items():
            out.setdefault(random, {}).update(labels)
    return out


def keylog_text(secrets: Secrets) -> str:
    """The secrets as an NSS key log (what a pcapng Decryption Secrets Block carries)."""
    return "".join(f"{label} {random.hex()} {secret.hex()}\n"
                   for random, labels in secrets.items() for label, secret in labels.items())


class Plain(NamedTuple):
    """Decrypted application data of one record. `offset` is the stream offset of the record's body: the
    plaintext's byte i is placed at offset + i, inside the record's bytes (a record's body is longer than its
    plaintext), so that positions stay distinct, ordered and the same at every capture point."""

    direction: int
    data: bytes
    first_ts: int
    first_frame: int
    last_ts: int
    last_frame: int
    offset: int


class Sealed(NamedTuple):
    """One application-data record that could not be decrypted: `wire_bytes` (header included) from `offset`."""

    direction: int
    wire_bytes: int
    first_ts: int
    first_frame: int
    last_ts: int
    last_frame: int
    offset: int


@dataclass(slots=True)
class _Record:
    type: int
    version: int
    body: bytes
    first_ts: int
    first_frame: int
    last_ts: int
    last_frame: int
    offset: int


class _Framer:
    """TLS records of one direction from in-order chunks; `broken` once something is not a record header."""

    def __init__(self):
        self.buf = bytearray()
        self.start = (0, 0, 0)  # ts, frame, offset of buf[0]
        self.broken = False

    def feed(self, data: bytes, ts: int, frame: int, offset: int) -> list[_Record]:
        if self.broken:
            return []
        buf = self.buf
        if not buf:
            self.start = (ts, frame, offset)
        buf += data
        out = []
        while len(buf) >= 5:
            kind, major, length = buf[0], buf[1], buf[3] << 8 | buf[4]
            if not (CHANGE_CIPHER_SPEC <= kind <= 24) or major != 3 or length > MAX_RECORD:
                self.broken = True
                buf.clear()
                break
            if len(buf) < 5 + length:
                break
            first_ts, first_frame, first_offset = self.start
            out.append(_Record(kind, buf[1] << 8 | buf[2], bytes(buf[5:5 + length]), first_ts, first_frame, ts,
                               frame, first_offset))
            del buf[:5 + length]
            self.start = (ts, frame, first_offset + 5 + length)
        return out

    @property
    def pending(self) -> int:
        return len(self.buf)


def _hkdf_expand_label(hash_name: str, secret: bytes, label: bytes, length: int) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

    full = b"tls13 " + label
    info = length.to_bytes(2, "big") + bytes([len(full)]) + full + b"\x00"
    algorithm = hashes.SHA256() if hash_name == "sha256" else hashes.SHA384()
    return HKDFExpand(algorithm, length, info).derive(secret)


def _tls12_prf(hash_name: str, secret: bytes, label: bytes, seed: bytes, length: int) -> bytes:
    """The TLS 1.2 PRF (RFC 5246 5): P_hash over HMAC."""
    seed = label + seed
    out = b""
    a = seed
    while len(out) < length:
        a = hmac.digest(secret, a, hash_name)
        out += hmac.digest(secret, a + seed, hash_name)
    return out[:length]


def _aead(kind: str, key: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    return AESGCM(key) if kind == "aes-gcm" else ChaCha20Poly1305(key)


class _Decrypter:
    """One direction's record protection: the AEAD, its IV and the record sequence number."""

    def __init__(self, version: int, kind: str, key: bytes, iv: bytes, hash_name: str = "sha256",
                 secret: bytes = b""):
        self.version, self.kind, self.iv, self.hash_name, self.secret = version, kind, iv, hash_name, secret
        self.aead = _aead(kind, key)
        self.key_len = len(key)
        self.seq = 0

    @classmethod
    def tls13(cls, suite: int, secret: bytes) -> _Decrypter:
        kind, key_len, hash_name = TLS13_SUITES[suite]
        return cls(0x0304, kind, _hkdf_expand_label(hash_name, secret, b"key", key_len),
                   _hkdf_expand_label(hash_name, secret, b"iv", 12), hash_name, secret)

    def updated(self) -> _Decrypter:
        """After a KeyUpdate (TLS 1.3): the next generation of this direction's traffic secret."""
        size = 32 if self.hash_name == "sha256" else 48
        secret = _hkdf_expand_label(self.hash_name, self.secret, b"traffic upd", size)
        return _Decrypter(0x0304, self.kind, _hkdf_expand_label(self.hash_name, secret, b"key", self.key_len),
                          _hkdf_expand_label(self.hash_name, secret, b"iv", 12), self.hash_name, secret)

    def open(self, record: _Record) -> tuple[int, bytes]:
        """(content type, plaintext); raises cryptography's InvalidTag (or ValueError) when it does not decrypt."""
        seq = self.seq.to_bytes(8, "big")
        body = record.body
        header = bytes([record.type]) + record.version.to_bytes(2, "big")
        if self.version == 0x0304:
            nonce = bytes(a ^ b for a, b in zip(self.iv, b"\x00" * 4 + seq))
            inner = self.aead.decrypt(nonce, body, header + len(body).to_bytes(2, "big"))
            self.seq += 1
            end = len(inner.rstrip(b"\x00"))
            if end == 0:
                raise ValueError("TLS 1.3 record without a content type")
            return inner[end - 1], inner[:end - 1]
        if self.kind == "aes-gcm":
            if len(body) < 24:
                raise ValueError("short TLS 1.2 GCM record")
            nonce, sealed = self.iv + body[:8], body[8:]
        else:
            nonce, sealed = bytes(a ^ b for a, b in zip(self.iv, b"\x00" * 4 + seq)), body
        plain_len = len(sealed) - 16
        if plain_len < 0:
            raise ValueError("short TLS 1.2 record")
        plain = self.aead.decrypt(nonce, sealed, seq + header + plain_len.to_bytes(2, "big"))
        self.seq += 1
        return record.type, plain


@dataclass
class TlsCounters:
    decrypted_bytes: int = 0  # record bytes (headers included) decrypted
    sealed_bytes: int = 0  # application-data record bytes not decrypted (timed only)
    handshake_bytes: int = 0  # handshake, change-cipher-spec and alert records (read in the clear or decrypted)
    failures: int = 0  # records that did not decrypt with the secrets given (wrong or partial key log)
    notes: list[str] = field(default_factory=list)


class TlsSession:
    """One connection's TLS, both directions. `secrets`: a key log (client random -> label -> secret), or None.
    `midstream`: the capture began after the handshake (every record is application data; nothing decrypts)."""

    def __init__(self, secrets: Secrets | None = None, midstream: bool = False):
        self.secrets = secrets
        self.counters = TlsCounters()
        self.framers = [_Framer(), _Framer()]
        self.client_random: bytes | None = None
        self.server_random: bytes | None = None
        self.version: int | None = None  # 0x0303 (TLS 1.2) or 0x0304 (TLS 1.3) once the ServerHello is read
        self.suite: int | None = None
        self.midstream = midstream
        # per direction: its handshake is over (later records are application data)
        self.done = [midstream, midstream]
        self.encrypted = [False, False]  # this direction's records are protected (after CCS / ServerHello)
        self.decrypters: list[_Decrypter | None] = [None, None]
        self.decrypting: bool | None = None  # None: not decided yet; True: secrets found; False: timed only
        self._hs_buf = [bytearray(), bytearray()]  # decrypted handshake messages, to find Finished / KeyUpdate
        self._client_finished_frame: int | None = None  # where the client's last flight (Finished) was (TLS 1.3)

    # ---- what the rest reads ------------------------------------------------------------------------------------
    @property
    def version_text(self) -> str | None:
        return {0x0301: "1.0", 0x0302: "1.1", 0x0303: "1.2", 0x0304: "1.3"}.get(self.version) if self.version else None

    @property
    def suite_name(self) -> str | None:
        return None if self.suite is None else SUITE_NAMES.get(self.suite, f"0x{self.suite:04X}")

    @property
    def broken(self) -> bool:
        return self.framers[CLIENT].broken or self.framers[SERVER].broken

    def gap(self, direction: int) -> None:
        """Bytes of `direction` were lost: its records cannot be framed (nor, in TLS 1.3, numbered) any more."""
        framer = self.framers[direction]
        framer.broken = True
        framer.buf.clear()

    def data(self, direction: int, data: bytes, ts: int, frame: int, offset: int) -> list[Plain | Sealed]:
        out: list[Plain | Sealed] = []
        for record in self.framers[direction].feed(data, ts, frame, offset):
            self._record(direction, record, out)
        return out

    # ---- records ------------------------------------------------------------------------------------------------
    def _record(self, direction: int, record: _Record, out: list) -> None:
        c = self.counters
        wire = 5 + len(record.body)
        if record.type == CHANGE_CIPHER_SPEC:
            c.handshake_bytes += wire
            if self.version != 0x0304:  # TLS 1.2: this direction's records are protected from the next one on
                self.encrypted[direction] = True
                self._arm_tls12(direction)
            return
        if not self.encrypted[direction] and record.type != APPLICATION_DATA:
            c.handshake_bytes += wire
            if record.type == HANDSHAKE:
                self._clear_handshake(direction, record.body)
            return
        if self.decrypting and self.decrypters[direction] is not None:
            return self._decrypt(direction, record, out)
        # not decrypted: what the record is follows from the handshake's course
        if record.type == APPLICATION_DATA and self._is_data(direction, record):
            c.sealed_bytes += wire
            out.append(Sealed(direction, wire, record.first_ts, record.first_frame, record.last_ts,
                              record.last_frame, record.offset))
        else:
            c.handshake_bytes += wire
            if self.version is not None and self.version < 0x0304 and record.type == HANDSHAKE:
                # TLS 1.0 … 1.2: the encrypted Finished
                self.done[direction] = True

    def _is_data(self, direction: int, record: _Record) -> bool:
        if self.done[direction]:
            return True
        if self.version == 0x0304:
            if direction == CLIENT:
                if self._client_finished_frame is None:  # the client's last flight: the server's is over too
                    self._client_finished_frame = record.last_frame
                    self.done[SERVER] = True
                    return False
                if record.last_frame == self._client_finished_frame:
                    return False  # (an empty Certificate, then) Finished: written at once, one segment
                self.done[CLIENT] = True
                return True
            return False  # the server's flight (EncryptedExtensions ... Finished)
        return self.version is None  # TLS 1.2 data before any Finished: only mid-stream

    def _clear_handshake(self, direction: int, body: bytes) -> None:
        """A handshake record in the clear: the hellos give the randoms, the version and the suite."""
        pos = 0
        while pos + 4 <= len(body):
            kind, length = body[pos], int.from_bytes(body[pos + 1:pos + 4], "big")
            msg = body[pos + 4:pos + 4 + length]
            pos += 4 + length
            if kind == 1 and direction == CLIENT and len(msg) >= 34:
                self.client_random = bytes(msg[2:34])
            elif kind == 2 and direction == SERVER and len(msg) >= 38:
                self._server_hello(msg)

    def _server_hello(self, msg: bytes) -> None:
        random = bytes(msg[2:34])
        if random == HELLO_RETRY_RANDOM:
            return
        self.server_random = random
        version = int.from_bytes(msg[0:2], "big")
        pos = 34
        sid = msg[pos]
        pos += 1 + sid
        if pos + 3 > len(msg):
            return
        self.suite = int.from_bytes(msg[pos:pos + 2], "big")
        pos += 3
        if pos + 2 <= len(msg):
            end = min(len(msg), pos + 2 + int.from_bytes(msg[pos:pos + 2], "big"))
            pos += 2
            while pos + 4 <= end:
                ext, size = int.from_bytes(msg[pos:pos + 2], "big"), int.from_bytes(msg[pos + 2:pos + 4], "big")
                if ext == 0x002B and size == 2:  # supported_versions: the version chosen
                    version = int.from_bytes(msg[pos + 4:pos + 6], "big")
                pos += 4 + size
        self.version = version
        if version == 0x0304:
            self.encrypted = [True, True]  # everything after the ServerHello (the client's after its hello)
            self._arm_tls13()
        else:
            self._decide(version == 0x0303 and self._session_secrets() is not None and self.suite in TLS12_SUITES
                         and "CLIENT_RANDOM" in self._session_secrets())

    # ---- keys ---------------------------------------------------------------------------------------------------
    def _session_secrets(self) -> Mapping[str, bytes] | None:
        if self.secrets is None or self.client_random is None:
            return None
        return self.secrets.get(self.client_random)

    def _decide(self, can: bool) -> None:
        if self.decrypting is None:
            self.decrypting = can

    def _arm_tls13(self) -> None:
        secrets = self._session_secrets()
        names = ("CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_HANDSHAKE_TRAFFIC_SECRET")
        if secrets is None or self.suite not in TLS13_SUITES or not all(n in secrets for n in names):
            self._decide(False)
            return
        self._decide(True)
        self.decrypters = [_Decrypter.tls13(self.suite, secrets[names[CLIENT]]),
                           _Decrypter.tls13(self.suite, secrets[names[SERVER]])]

    def _arm_tls12(self, direction: int) -> None:
        secrets = self._session_secrets()
        if not self.decrypting or secrets is None or self.server_random is None:
            return
        kind, key_len, hash_name = TLS12_SUITES[self.suite]
        iv_len = 4 if kind == "aes-gcm" else 12
        block = _tls12_prf(hash_name, secrets["CLIENT_RANDOM"], b"key expansion",
                           self.server_random + self.client_random, 2 * (key_len + iv_len))
        key = block[direction * key_len:(direction + 1) * key_len]
        iv = block[2 * key_len + direction * iv_len:2 * key_len + (direction + 1) * iv_len]
        self.decrypters[direction] = _Decrypter(0x0303, kind, key, iv, hash_name)

    def _decrypt(self, direction: int, record: _Record, out: list) -> None:
        c = self.counters
        wire = 5 + len(record.body)
        try:
            kind, plain = self.decrypters[direction].open(record)
        except Exception as exc:  # cryptography's InvalidTag, or a malformed record: this direction is lost
            c.failures += 1
            if len(c.notes) < 5:
                c.notes.append(f"{'client' if direction == CLIENT else 'server'} record at offset {record.offset} "
                               f"did not decrypt ({type(exc).__name__}): wrong or partial key log?")
            self.framers[direction].broken = True
            return
        c.decrypted_bytes += wire
        if kind == APPLICATION_DATA:
            if plain:
                out.append(Plain(direction, plain, record.first_ts, record.first_frame, record.last_ts,
                                 record.last_frame, record.offset + 5))
            return
        if kind == HANDSHAKE:
            self._encrypted_handshake(direction, plain)
        elif kind == ALERT:
            pass

    def _encrypted_handshake(self, direction: int, plain: bytes) -> None:
        """Decrypted handshake messages: a TLS 1.3 Finished moves its direction to the application secrets, a
        KeyUpdate to the next generation; in TLS 1.2 the Finished ends the handshake."""
        buf = self._hs_buf[direction]
        buf += plain
        while len(buf) >= 4:
            length = int.from_bytes(buf[1:4], "big")
            if len(buf) < 4 + length:
                break
            kind = buf[0]
            del buf[:4 + length]
            if kind == 20:  # Finished
                self.done[direction] = True
                if self.version == 0x0304:
                    name = ("CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0")[direction]
                    secret = (self._session_secrets() or {}).get(name)
                    if secret is None:
                        self.framers[direction].broken = True
                        self.counters.notes.append(f"the key log has no {name} for this session")
                        return
                    self.decrypters[direction] = _Decrypter.tls13(self.suite, secret)
            elif kind == 24 and self.version == 0x0304 and self.decrypters[direction] is not None:
                self.decrypters[direction] = self.decrypters[direction].updated()
