"""What the consumer library (``sinks.kafka.consumer``) hands the target it rebuilds tables in: the decoded
:class:`Event` with its place in commit order, the :class:`Applier` protocol a target implements
(``sinks.kafka.applier.SinkApplier`` for SQL targets, or any other), and :func:`is_drop_table`, how both sides tell a
DROP TABLE event (:func:`is_create_table`: a CREATE TABLE one). No I/O; the consumer and its targets import this,
never each other."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from sinks.codec import DecodedEvent
from sinks.kafka.headers import DdlHeader


@dataclasses.dataclass(slots=True)
class Event:
    """A decoded row or DDL event with where it came from and its place in commit order."""

    ev: DecodedEvent
    commit_ts: int
    span: int
    seq: int | None
    topic: str
    partition: int
    offset: int
    ddl: DdlHeader | None = None  # a DDL's tidewater-ddl header

    def order(self) -> tuple[int, int, int, int, int]:
        return (self.commit_ts, self.span, -1 if self.seq is None else self.seq, self.partition, self.offset)


class Applier(Protocol):
    """A target of the consumer library. Called from the consumer's one thread: :meth:`open` first, then
    :meth:`observe` and :meth:`apply` as records are read, :meth:`close` last."""

    def open(self) -> int:
        """Prepare the target; return the watermark it already holds (0: none)."""

    def apply(self, events: list[Event], watermark: int, watermark_time: float) -> None:
        """Apply ``events`` (sorted in commit order, all at or below ``watermark``) and record ``watermark``
        atomically where the target allows."""

    def observe(self, event: Event) -> None:
        """An event at or below the applied watermark, read again (a restarted consumer reads from the start): not
        to be applied, but it tells the table's columns as the target holds them."""

    def close(self) -> None: ...


def is_drop_table(ev: DecodedEvent) -> bool:
    """A DROP TABLE event (canal-json ERASE, open-protocol action 4, or the statement)."""
    if ev.extra.get("type") == "ERASE" or ev.extra.get("action") == 4:
        return True
    return (ev.query or "").lstrip().upper().startswith("DROP TABLE") and "type" not in ev.extra \
        and "action" not in ev.extra


def is_create_table(ev: DecodedEvent) -> bool:
    """A CREATE TABLE event (canal-json CREATE, open-protocol action 3, or the statement)."""
    if "type" in ev.extra or "action" in ev.extra:
        return ev.extra.get("type") == "CREATE" or ev.extra.get("action") == 3
    return (ev.query or "").lstrip().upper().startswith("CREATE TABLE")
