"""The Kafka sink's outgoing row messages: the sink (``sinks.kafka.sink``) decides which changes go to which (topic,
partition) and with which event positions; the :class:`Outbox` keeps one encoder per destination (:class:`Dest`), and
:meth:`Outbox.drain` builds the protocol's messages from what was appended and sends each with its ``tidewater``
header (``sinks.kafka.headers``) through the transport it is given. A message over its destination's size limit is
split into one message per row, or shrunk by ``sinks.kafka.large`` (key-only, claim check) or refused there. No
transactions and no positions here: those are the sink's. kafka-python is imported only for a message near its
limit (``sinks.kafka.transport.message_size``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from cdc.errors import SinkError
from cdc.events import RowChange
from sinks.codec import EncoderConfig, Message, MessageKind, encoder_for
from sinks.codec.base import RowEventEncoder
from sinks.kafka.headers import row_header
from sinks.kafka.large import LargeMessages

if TYPE_CHECKING:
    from sinks.kafka.transport import KafkaTransport

BATCH_HEADER = 61  # a record batch's header: message_size() - Message.size
HEADER_ALLOWANCE = 256  # our headers, left out of the encoders' max-message-bytes


class Dest:
    """One (topic, partition): its encoder, its message size limit, and the changes appended since the last build
    with their event positions."""

    __slots__ = ("topic", "partition", "limit", "enc", "items", "copied")

    def __init__(self, topic: str, partition: int, limit: int, enc: RowEventEncoder) -> None:
        self.topic = topic
        self.partition = partition
        self.limit = limit
        self.enc = enc
        self.items: list[tuple[RowChange, int]] = []
        self.copied = 0  # copied rows appended (a copy chunk's count per partition: KafkaSink.write_copy_chunk)


class Outbox:
    """The destinations of one sink (see the module docstring). The sink appends to a destination's encoder and
    ``items`` directly (its row loop: :attr:`dests`, :meth:`dest`), then calls :meth:`drain`. After an exception the
    encoders' state is unspecified: :meth:`clear`. One caller thread at a time (the sink's)."""

    def __init__(self, protocol: str, codec: EncoderConfig, large: LargeMessages, *,
                 clock: Callable[[], float]) -> None:
        self.protocol = protocol
        self.codec = codec
        self._large = large
        self._clock = clock
        self.dests: dict[tuple[str, int], Dest] = {}
        self._span_header: bytes | None = None  # of the drain in progress
        self._span: int | None = None

    def dest(self, tr: KafkaTransport, topic: str, partition: int) -> Dest:
        """The destination (``topic``, ``partition``), made on first use with the topic's message size limit."""
        d = self.dests.get((topic, partition))
        if d is None:
            limit = tr.topic(topic).max_message_bytes
            cfg = dataclasses.replace(self.codec, max_message_bytes=max(1024, limit - BATCH_HEADER - HEADER_ALLOWANCE))
            d = self.dests[(topic, partition)] = Dest(topic, partition, limit,
                                                      encoder_for(self.protocol, cfg, clock=self._clock))
        return d

    def clear(self) -> None:
        self.dests.clear()

    def reset_copied(self) -> None:
        for d in self.dests.values():
            d.copied = 0

    def copied(self) -> dict[tuple[str, int], int]:
        """Copied rows appended per (topic, partition) since :meth:`reset_copied` (those with any)."""
        return {(d.topic, d.partition): d.copied for d in self.dests.values() if d.copied}

    def drain(self, tr: KafkaTransport, span_header: bytes | None, span: int | None) -> None:
        """Build and send every destination's messages (in order per destination), each with the changes (and
        event positions) it carries: a ROW message ``msg.rows`` of them, a DDL-shaped one (TRUNCATE) one, a
        tombstone none. ``span_header``: the ``tidewater`` header's span part; ``span``: the span (claim checks)."""
        ROW, TOMBSTONE = MessageKind.ROW, MessageKind.TOMBSTONE  # noqa: N806 - locals for the loop
        self._span_header, self._span = span_header, span
        for d in self.dests.values():
            items = d.items
            if not items:
                continue
            d.items = []
            i = 0
            for msg in d.enc.build():
                kind = msg.kind
                take = msg.rows if kind is ROW else 0 if kind is TOMBSTONE else 1
                self._send(tr, d, msg, items[i:i + take] if take != 1 else [items[i]])
                i += take
            if i != len(items):
                raise SinkError(f"internal: {self.protocol} built messages for {i} of {len(items)} "
                                f"changes on topic {d.topic} partition {d.partition}")

    def _headers(self, msg: Message, items: list[tuple[RowChange, int]]) -> list[tuple[str, bytes]]:
        """Debezium's own headers, then ``tidewater`` (the span and the event positions of the message's changes,
        ``sinks.kafka.headers``); a tombstone gets none."""
        headers = list(msg.headers) if msg.headers else []
        if items:
            headers.append(row_header(self._span_header, [s for _, s in items]))
        return headers

    def _send(self, tr: KafkaTransport, d: Dest, msg: Message, items: list[tuple[RowChange, int]]) -> None:
        headers = self._headers(msg, items)
        size = (len(msg.key) if msg.key else 0) + (len(msg.value) if msg.value else 0)
        if size + HEADER_ALLOWANCE + 128 >= d.limit:
            from sinks.kafka.transport import message_size

            size = message_size(msg.key, msg.value, headers)
            if size > d.limit:
                self._oversized(tr, d, msg, items, size)
                return
        tr.send(d.topic, d.partition, msg.key, msg.value, headers)

    def _oversized(self, tr: KafkaTransport, d: Dest, msg: Message, items: list[tuple[RowChange, int]],
                   size: int) -> None:
        from sinks.kafka.transport import message_size

        if len(items) > 1:  # a batch that came out larger than the codec counted: one message per row
            for change, seq in items:
                enc = encoder_for(self.protocol, self.codec, clock=self._clock)
                enc.append_row(change)
                for m in enc.build():
                    self._send(tr, d, m, [(change, seq)] if m.kind is not MessageKind.TOMBSTONE else [])
            return
        small, headers = self._large.shrink(
            msg, items[0][0] if items else None, items[0][1] if items else 0, protocol=self.protocol,
            enc=d.enc, size=size, limit=d.limit, topic=d.topic, partition=d.partition, span=self._span,
            headers=lambda m: self._headers(m, items),
            measure=lambda m, h: message_size(m.key, m.value, h))
        tr.send(d.topic, d.partition, small.key, small.value, headers)
