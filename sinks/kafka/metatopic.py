"""The Kafka sink's use of its metadata topic ``_tidewater.<topic>`` (``sinks.kafka.meta``: names, encoding, the
reader): the per-table topics it writes to (so that watermarks reach them after a restart and from the owner), the
copies' chunk markers and announcements (``sinks.kafka.copy_markers``) and, with ``kafka-transactional``, the span's
position, last in each transaction. A mixin of
:class:`sinks.kafka.sink.KafkaSink`, kept apart to keep the sink's module about writing; kafka-python is imported
only when the topic is used (``sinks.kafka.meta``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sinks.kafka.dispatcher import Dispatcher
    from sinks.kafka.meta import MetaReader
    from sinks.kafka.options import KafkaOptions
    from sinks.kafka.transport import KafkaTransport


class MetaTopicUse:
    """The metadata-topic methods of the Kafka sink (see the module docstring); the sink provides the attributes."""

    options: KafkaOptions
    dispatcher: Dispatcher
    changefeed: str | None
    span: int | None
    _origin: int
    _clock: Callable[[], float]
    _topics_used: set[str]
    _topics_recorded: set[str]
    _meta: MetaReader | None
    _meta_factory: Callable[[KafkaOptions], MetaReader] | None

    def _tr(self) -> KafkaTransport:
        raise NotImplementedError

    def _use_topic(self, tr: KafkaTransport, topic: str) -> None:
        """``topic`` gets rows: with per-table topics it is recorded in the metadata topic (once per sink), so
        that watermarks reach it after a restart and from the owner."""
        self._topics_used.add(topic)
        if topic == self.options.topic or topic in self._topics_recorded or not self.dispatcher.has_table_topics:
            return
        from sinks.kafka.meta import encode, meta_topic_name

        meta = meta_topic_name(self.options.topic)
        tr.topic(meta, 1)
        tr.send(meta, 0, f"topic/{topic}".encode(), encode({"since": round(self._clock(), 3)}))
        self._topics_recorded.add(topic)

    def _record_position(self, tr: KafkaTransport, position: tuple[int, int]) -> None:
        """The span's position, last in its transaction and only after the transaction's messages were acknowledged:
        under Kafka's semantics the order does not matter (all or nothing), but a broker that lets aborted records
        through (tansu) then never shows a position whose messages did not all reach it."""
        from sinks.kafka.meta import checkpoint_key, encode, meta_topic_name

        assert self.changefeed is not None and self.span is not None
        meta = meta_topic_name(self.options.topic)
        tr.topic(meta, 1)
        value = {"ts": position[0], "step": position[1], "origin": self._origin, "time": round(self._clock(), 3)}
        tr.send(meta, 0, checkpoint_key(self.changefeed, self.span).encode(), encode(value))

    def _record_copy(self, tr: KafkaTransport, records: list[tuple[bytes, bytes]]) -> None:
        """A copy's chunk marker or announcement (``sinks.kafka.copy_markers``), acknowledged before returning: the
        marker after its chunk's rows were (so the copy records the chunk only once its marker is there), the
        announcement before the span's next change of the table."""
        from sinks.kafka.meta import meta_topic_name

        meta = meta_topic_name(self.options.topic)
        tr.topic(meta, 1)
        for key, value in records:
            tr.send(meta, 0, key, value)
        tr.flush()

    def _meta_records(self, *, fresh: bool, transport: KafkaTransport | None = None) -> dict[str, dict[str, Any]]:
        from sinks.kafka.meta import MetaReader

        tr = transport or self._tr()
        if self._meta is None:
            self._meta = (self._meta_factory or MetaReader)(self.options)
            return self._meta.read_all(tr)
        return self._meta.read_all(tr) if fresh else self._meta.poll()

