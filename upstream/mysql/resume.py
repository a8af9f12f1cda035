"""A MySQL/MariaDB span's resume token: where its stream continues, on the same server or on a promoted replica.

The token a span's checkpoint carries (:meth:`upstream.base.SpanSource.resume_token`, stored opaquely in
``cdc.model.SpanStatus.resume_token``) is a :class:`ResumePoint` as JSON: the Ts epoch (:mod:`upstream.mysql.positions`),
the ``server_id`` of the server it was read from, the binlog file and position after the last checkpointed transaction
and the GTID state there (MariaDB: ``gtid_binlog_pos`` style, one ``domain-server-seq`` per domain). On the same
server the span resumes at the file and position; on another server (a promoted replica, ``changefeed update
--upstream``) at the GTID state, with the epoch one higher, so that its Ts stay above every Ts of the old server.

:class:`GtidState` is MariaDB's GTID position: ``domain -> (server_id, seq_no)``; one server's binlog is ordered by
``seq_no`` within a domain (``gtid_strict_mode`` enforces it), so a replica *contains* a state when, in every domain,
its own position has a ``seq_no`` at least as high.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from cdc.errors import DecodeError


@dataclass(frozen=True, slots=True)
class GtidState:
    """MariaDB GTID position (``gtid_binlog_pos`` style): ``domains`` maps domain id -> (server_id, seq_no)."""

    domains: Mapping[int, tuple[int, int]]

    @classmethod
    def parse(cls, text: str) -> GtidState:
        """``"0-1-42,1-2-7"`` (empty: no transaction yet); DecodeError when malformed or a domain repeats."""
        out: dict[int, tuple[int, int]] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            bits = part.split("-")
            if len(bits) != 3 or not all(b.isdigit() for b in bits):
                raise DecodeError(f"malformed MariaDB GTID {part!r} in {text!r}")
            d, s, n = map(int, bits)
            if d in out:
                raise DecodeError(f"GTID position {text!r} names domain {d} twice")
            out[d] = (s, n)
        return cls(out)

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(self.domains.items()))

    def missing_in(self, other: GtidState) -> list[str]:
        """What ``other`` (a server's position) lacks of this state: per domain, the GTIDs it has not applied yet
        (empty: ``other`` contains this state)."""
        out = []
        for d, (s, n) in sorted(self.domains.items()):
            have = other.domains.get(d)
            if have is None:
                out.append(f"domain {d}: every GTID up to {d}-{s}-{n} (the server has none of domain {d})")
            elif have[1] < n:
                out.append(f"domain {d}: {d}-?-{have[1] + 1} .. {d}-{s}-{n} (the server is at {d}-{have[0]}-{have[1]})")
        return out

    def after(self, other: GtidState) -> list[str]:
        """The domains in which ``other`` (the state at the start of a server's oldest binlog) is already past this
        state: the binlog no longer holds the transactions right after it (empty: it does)."""
        out = []
        for d, (s, n) in sorted(self.domains.items()):
            have = other.domains.get(d)
            if have is not None and have[1] > n:
                out.append(f"domain {d}: the oldest binlog starts after {d}-{have[0]}-{have[1]}, past {d}-{s}-{n}")
        return out


class MysqlGtidSet:
    """MySQL's GTID set (``@@gtid_executed`` style): ``uuid:1-5:7,uuid2:1-3``, source uuid -> sorted disjoint
    inclusive intervals of transaction numbers. ``str`` gives MySQL's own spelling (uuids in lower case and sorted,
    intervals merged), so two equal sets print the same."""

    __slots__ = ("sets",)

    def __init__(self, sets: Mapping[str, list[tuple[int, int]]] | None = None) -> None:
        self.sets: dict[str, list[tuple[int, int]]] = {k: list(v) for k, v in (sets or {}).items()}

    @classmethod
    def parse(cls, text: str) -> MysqlGtidSet:
        """``"3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5:7,..."`` (empty: no transaction); DecodeError when malformed."""
        out = cls()
        for part in filter(None, (p.strip() for p in text.replace("\n", "").split(","))):
            uuid, *ranges = part.split(":")
            if len(uuid.replace("-", "")) != 32 or not ranges:
                raise DecodeError(f"malformed MySQL GTID set {part!r} in {text!r}")
            for r in ranges:
                lo, _, hi = r.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise DecodeError(f"malformed MySQL GTID interval {r!r} in {text!r}")
                out.add_interval(uuid.lower(), int(lo), int(hi or lo))
        return out

    def add_interval(self, uuid: str, lo: int, hi: int) -> None:
        ivs = self.sets.setdefault(uuid, [])
        ivs.append((lo, hi))
        ivs.sort()
        merged: list[tuple[int, int]] = []
        for a, b in ivs:
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.sets[uuid] = merged

    def add(self, uuid: str, gno: int) -> None:
        """Add one GTID (the common case, the next number of a uuid's last interval, is O(1))."""
        ivs = self.sets.get(uuid)
        if ivs and ivs[-1][1] + 1 == gno:
            ivs[-1] = (ivs[-1][0], gno)
        elif not ivs or not any(a <= gno <= b for a, b in ivs):
            self.add_interval(uuid, gno, gno)

    def copy(self) -> MysqlGtidSet:
        return MysqlGtidSet(self.sets)

    def __str__(self) -> str:
        return ",".join(uuid + "".join(f":{a}" if a == b else f":{a}-{b}" for a, b in ivs)
                        for uuid, ivs in sorted(self.sets.items()) if ivs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MysqlGtidSet) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))


def uuid_text(raw: bytes) -> str:
    """A GTID event's 16-byte source uuid in MySQL's spelling (lower case, dashed)."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def is_mysql_gtid(text: str) -> bool:
    """Whether a token's GTID text is a MySQL GTID set (uuid:intervals) rather than a MariaDB GTID state."""
    return ":" in text


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a span continues: ``epoch`` of its Ts, ``server_id`` of the server ``file``/``pos`` belong to, and the GTID
    state there (``gtid``: MariaDB's ``domain-server-seq`` list, or MySQL's executed GTID set ``uuid:1-42,...``;
    empty when the server has none: MySQL with ``gtid_mode`` OFF)."""

    epoch: int
    server_id: int
    file: str
    pos: int
    gtid: str

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, token: str) -> ResumePoint:
        """The point a token made by :meth:`encode` names; DecodeError when it is not one (another upstream's)."""
        try:
            doc = json.loads(token)
            point = cls(int(doc["epoch"]), int(doc["server_id"]), str(doc["file"]), int(doc["pos"]), str(doc["gtid"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"not a MySQL resume token: {token[:120]!r} ({exc})") from exc
        if is_mysql_gtid(point.gtid):
            MysqlGtidSet.parse(point.gtid)
        else:
            GtidState.parse(point.gtid)
        return point
