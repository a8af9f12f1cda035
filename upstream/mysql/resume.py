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


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a span continues: ``epoch`` of its Ts, ``server_id`` of the server ``file``/``pos`` belong to, and the GTID
    state there (``gtid``: MariaDB's ``domain-server-seq`` list; empty when the server has none, e.g. MySQL)."""

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
        GtidState.parse(point.gtid)
        return point
