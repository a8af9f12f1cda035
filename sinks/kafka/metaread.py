"""Reading the Kafka sink's metadata topic (``sinks.kafka.meta`` describes it): :class:`MetaReader`, one
``read_committed`` consumer of its one partition. Readers decide transactions from the log's own markers as well
(:class:`sinks.kafka.txnread.CommittedRecords`): an aborted or undecided transaction's checkpoint is never read back,
also on a broker that shows aborted records to ``read_committed`` consumers (tansu). Reading one back would make a
restarted span skip transactions that were never committed. Nor does a reader miss a record that a broker stored
after a later one (:class:`sinks.kafka.holes.ContiguousRecords`: each span's producer writes the topic's one partition,
and so do the copy writers): a position record skipped would be read as an older position, and a transaction's
marker skipped would hold its records back for good."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from cdc.errors import SinkUnavailable
from sinks.kafka.errors import wrap
from sinks.kafka.holes import ContiguousRecords
from sinks.kafka.logstart import FIRST_OFFSET, RESET, out_of_range, seek_to_start
from sinks.kafka.meta import meta_topic_name
from sinks.kafka.options import KafkaOptions
from sinks.kafka.transport import KafkaTransport, client_config
from sinks.kafka.txnread import CommittedRecords

log = logging.getLogger(__name__)


class MetaReader:
    """Reads the metadata topic (``read_committed``) incrementally: :meth:`read_all` the first time (up to a
    marker it writes first), :meth:`poll` for what came since. Holds one consumer until :meth:`close`."""

    def __init__(self, options: KafkaOptions, *, consumer_factory: Callable[..., Any] | None = None,
                 timeout: float | None = None) -> None:
        self.options = options
        self.topic = meta_topic_name(options.topic)
        self.records: dict[str, dict[str, Any]] = {}
        self._factory = consumer_factory
        self._consumer: Any = None
        self._committed: CommittedRecords | None = None
        self._holes: ContiguousRecords | None = None
        self._timeout = timeout if timeout is not None else options.dial_timeout + options.delivery_timeout

    def _open(self) -> Any:
        if self._consumer is None:
            factory = self._factory
            if factory is None:
                from kafka import KafkaConsumer as factory
            from kafka import TopicPartition

            try:
                consumer = factory(**client_config(self.options), isolation_level="read_committed",
                                   enable_auto_commit=False, group_id=None, auto_offset_reset=RESET,
                                   consumer_timeout_ms=1000)
                tps = [TopicPartition(self.topic, 0)]
                consumer.assign(tps)
                seek_to_start(consumer, tps)  # not the broker's EARLIEST: sinks.kafka.logstart
            except Exception as exc:
                raise wrap(exc, self.options.where(), topic=self.topic, doing="reading the sink's metadata") from exc
            self._consumer = consumer
            # a test's fake consumer has no fetcher to watch: it returns committed records only
            if hasattr(consumer, "_fetcher"):
                self._committed = CommittedRecords(consumer)
                self._holes = ContiguousRecords(consumer)
                self._holes.start((self.topic, 0), FIRST_OFFSET)
        return self._consumer

    def read_all(self, transport: KafkaTransport) -> dict[str, dict[str, Any]]:
        """Every key's last record committed before this call (writes a marker through ``transport``, which must
        not be inside a transaction, then reads up to it)."""
        marker = f"marker/{uuid.uuid4().hex}"
        transport.topic(self.topic, 1)
        if transport.transactional_id is not None:
            transport.begin()
            transport.send(self.topic, 0, marker.encode(), b"{}")
            transport.commit()
        else:
            transport.send(self.topic, 0, marker.encode(), b"{}")
            transport.flush()
        deadline = time.monotonic() + self._timeout
        while not self._take(self._fetch(1.0), marker):
            if time.monotonic() > deadline:
                self.close()
                raise SinkUnavailable(f"{self.options.where()}: the sink's metadata topic {self.topic} did not return "
                                      f"the marker written to it within {self._timeout:g} s")
        return self.records

    def poll(self) -> dict[str, dict[str, Any]]:
        """Records that arrived since the last read (merged into :attr:`records`)."""
        self._take(self._fetch(0.0), None)
        return self.records

    def _fetch(self, wait: float) -> list[Any]:
        consumer = self._open()
        try:
            batches = consumer.poll(timeout_ms=int(wait * 1000), max_records=10_000)
        except Exception as exc:
            self.close()
            err = out_of_range(exc, f"{self.options.where()}: the sink's metadata topic")
            raise err or wrap(exc, self.options.where(), topic=self.topic, doing="reading the sink's metadata") from exc
        if self._holes is not None:
            batches = self._holes.take(batches)
        records = [r for part in batches.values() for r in part]
        return self._committed.take(records) if self._committed is not None else records

    def _take(self, records: list[Any], marker: str | None) -> bool:
        seen = False
        for r in records:
            key = r.key.decode() if r.key else ""
            if key.startswith("marker/"):
                seen = seen or key == marker
                continue
            try:
                value = json.loads(r.value) if r.value else None
            except ValueError:
                log.warning("topic %s offset %d: not JSON, ignored", self.topic, r.offset)
                continue
            if isinstance(value, dict):
                self.records[key] = value
            else:
                self.records.pop(key, None)
        return seen

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        self._committed = self._holes = None
        if consumer is not None:
            try:
                consumer.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken consumer
                log.debug("closing the metadata consumer: %s", exc)
