"""The Kafka sink's metadata topic: ``_tidewater.<topic>`` next to the sink URI's topic, one partition, small JSON
records, the last record of a key wins (read back in full: compaction is not relied on, tansu has none).

Keys:

- ``checkpoint/<changefeed>/<span>``: ``{"ts", "step", "time", "origin"}``, the position of the span's last Kafka
  transaction (``kafka-transactional=true``), written inside that transaction so that it commits with the messages
  or not at all (``KafkaSink.open_position`` reads it back on restart).
- ``topic/<name>``: a topic the sink's dispatcher rules sent rows to (only with per-table topics): the owner's
  checkpoint watermarks and a restarted span's watermarks go to every partition of every such topic.
- ``chunk/<schema>.<table>/<ts>/<chunk>`` and ``copied/<schema>.<table>/<ts>``: a copy's chunk markers and a table's
  copy announcement, for the consumers (``sinks.kafka.copy_markers``; written by every sink with a copy, whatever
  its topics).
- ``marker/<uuid>``: written by a reader before it reads, so that it knows when it has read everything committed
  before it began (end offsets cannot be trusted on every broker: docs/sinks.md, "Test broker").

The topic is created with one partition when missing (and ``auto-create-topic`` allows; otherwise create it).
Readers use ``read_committed`` and never read back an aborted or undecided transaction's records
(``sinks.kafka.metaread``).

This module holds the layout above and :class:`MetaTopic`, the sink's side of the topic (what it records there and
reads back). It imports no Kafka client: writes go through the transport the sink passes, reads through the
reader it is given (``sinks.kafka.metaread.MetaReader``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sinks.kafka.options import KafkaOptions
    from sinks.kafka.transport import KafkaTransport

PREFIX = "_tidewater."


def meta_topic_name(topic: str) -> str:
    """``_tidewater.<topic>`` (cut to Kafka's 249 characters)."""
    return (PREFIX + topic)[:249]


def checkpoint_key(changefeed: str, span: int) -> str:
    return f"checkpoint/{changefeed}/{span}"


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class Reader(Protocol):
    """What :class:`MetaTopic` reads through (``sinks.kafka.metaread.MetaReader``, or a test's fake)."""

    def read_all(self, transport: KafkaTransport) -> dict[str, dict[str, Any]]: ...

    def poll(self) -> dict[str, dict[str, Any]]: ...

    def close(self) -> None: ...


class MetaTopic:
    """The Kafka sink's side of its metadata topic (see the module docstring): it records the per-table topics rows
    went to (so that watermarks reach them after a restart and from the owner), the span's position with
    ``kafka-transactional`` (last in each transaction), the copies' chunk markers and announcements
    (``sinks.kafka.copy_markers``), and reads them back.

    Writes go through the transport each call is given (the sink's, inside its transaction when it has one); reads
    through one reader made by ``reader(options)`` on first use, kept until :meth:`close`. One caller thread at a time
    (the sink's)."""

    def __init__(self, options: KafkaOptions, *, table_topics: bool, clock: Callable[[], float],
                 reader: Callable[[KafkaOptions], Reader]) -> None:
        self.options = options
        self.name = meta_topic_name(options.topic)
        self._table_topics = table_topics  # the dispatcher sends some tables to topics of their own
        self._clock = clock
        self._reader_factory = reader
        self._reader: Reader | None = None
        self._used: set[str] = set()
        self._recorded: set[str] = set()

    def use_topic(self, tr: KafkaTransport, topic: str) -> None:
        """Rows or DDL go to ``topic``: remembered for the watermarks and, with per-table topics, recorded in the
        metadata topic (once per sink), so that watermarks reach it after a restart and from the owner."""
        if topic in self._used:
            return
        self._used.add(topic)
        if topic == self.options.topic or topic in self._recorded or not self._table_topics:
            return
        tr.topic(self.name, 1)
        tr.send(self.name, 0, f"topic/{topic}".encode(), encode({"since": round(self._clock(), 3)}))
        self._recorded.add(topic)

    def watermark_topics(self, tr: KafkaTransport) -> set[str]:
        """Every topic a watermark goes to: the URI's, those this sink used and, with per-table topics, those any
        run recorded (read through ``tr`` the first time, then what arrived since)."""
        topics = {self.options.topic, *self._used}
        if self._table_topics:
            topics.update(k[len("topic/"):] for k in self._records(tr, fresh=False) if k.startswith("topic/"))
        return topics

    def record_position(self, tr: KafkaTransport, changefeed: str, span: int, position: tuple[int, int],
                        origin: int) -> None:
        """The span's position, last in its transaction and only after the transaction's messages were acknowledged:
        under Kafka's semantics the order does not matter (all or nothing), but a broker that lets aborted records
        through (tansu) then never shows a position whose messages did not all reach it."""
        tr.topic(self.name, 1)
        value = {"ts": position[0], "step": position[1], "origin": origin, "time": round(self._clock(), 3)}
        tr.send(self.name, 0, checkpoint_key(changefeed, span).encode(), encode(value))

    def stored_position(self, tr: KafkaTransport, changefeed: str, span: int) -> dict[str, Any] | None:
        """The span's last committed position as :meth:`record_position` stored it (everything committed before this
        call read through ``tr``), None when there is none."""
        return self._records(tr, fresh=True).get(checkpoint_key(changefeed, span)) or None

    def record_copy(self, tr: KafkaTransport, records: Iterable[tuple[bytes, bytes]]) -> None:
        """A copy's chunk marker or announcement (``sinks.kafka.copy_markers``), acknowledged before returning: the
        marker after its chunk's rows were (so the copy records the chunk only once its marker is there), the
        announcement before the span's next change of the table."""
        tr.topic(self.name, 1)
        for key, value in records:
            tr.send(self.name, 0, key, value)
        tr.flush()

    def _records(self, tr: KafkaTransport, *, fresh: bool) -> dict[str, dict[str, Any]]:
        if self._reader is None:
            self._reader = self._reader_factory(self.options)
            return self._reader.read_all(tr)
        return self._reader.read_all(tr) if fresh else self._reader.poll()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
