"""Topic management for the Kafka transport: find a topic, create it when ``auto-create-topic`` allows, read its
partition count and message size limit.

Guarantees:
- :meth:`TopicAdmin.ensure` never creates a topic when ``auto-create-topic=false``: it reads metadata with
  auto-creation off (the admin client's request), and a missing topic is a :class:`SinkError` naming it and the
  fix. (Producers' metadata requests can create topics on some brokers, tansu included, even when told not to:
  the transport sends to a topic only after ``ensure`` found it.)
- A topic it creates gets ``partition-num`` partitions (3 when not given), ``replication-factor`` replicas and
  ``max.message.bytes`` = ``max-message-bytes`` (as TiCDC creates its topics: the broker then accepts every message
  the sink may send, and no larger one); a topic created concurrently by another span or capture counts as found.
- An existing topic with fewer partitions than ``partition-num`` is a :class:`SinkError` (TiCDC's rule: the sink
  would address partitions that do not exist); with more, the sink writes rows to the first ``partition-num`` and
  watermarks to all of them (``TopicInfo.all_partitions``: consumers read every partition and cut at the minimum).
- The message size limit is ``max-message-bytes``, lowered to the topic's ``max.message.bytes`` when the broker
  reports a smaller one (Apache Kafka does; tansu reports it only when set at creation, and enforces nothing).
- Errors: brokers unreachable or not answering -> :class:`SinkUnavailable`; refused (authorization, invalid
  replication factor) -> :class:`SinkError` (:mod:`sinks.kafka.errors`).

Threading: one caller thread at a time. ``close`` releases the admin connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import errors as kerr

from cdc.errors import SinkError, SinkUnavailable
from sinks.kafka.errors import describe, wrap
from sinks.kafka.options import KafkaOptions

log = logging.getLogger(__name__)

_UNKNOWN_TOPIC = kerr.UnknownTopicOrPartitionError.errno
_TOPIC_EXISTS = kerr.TopicAlreadyExistsError.errno
_LEADER_NOT_AVAILABLE = kerr.LeaderNotAvailableError.errno
_VISIBLE_WAIT = 10.0  # seconds a created topic may take to show its partitions in metadata


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int  # partitions the sink writes to: min(the topic's, partition-num when given)
    max_message_bytes: int  # the limit send() enforces
    created: bool = False  # created by this call
    total: int = 0  # the topic's own partition count (0: the same as ``partitions``)

    @property
    def all_partitions(self) -> int:
        """Every partition of the topic: a consumer reads them all, so watermarks go to each (rows only to the
        first ``partitions``)."""
        return max(self.total, self.partitions)


class TopicAdmin:
    """The admin side of one transport (a ``KafkaAdminClient`` opened on first use)."""

    def __init__(self, options: KafkaOptions, client_config: dict[str, Any],
                 *, admin_factory: Callable[..., Any] | None = None, sleep: Callable[[float], None] = time.sleep
                 ) -> None:
        self._opts = options
        self._config = client_config
        self._factory = admin_factory
        self._sleep = sleep
        self._admin: Any = None

    def _client(self) -> Any:
        if self._admin is None:
            factory = self._factory
            if factory is None:
                from kafka import KafkaAdminClient as factory
            try:
                self._admin = factory(**self._config)
            except Exception as exc:
                raise wrap(exc, self._opts.where(), doing="connecting") from exc
        return self._admin

    def ensure(self, topic: str, partitions: int | None = None) -> TopicInfo:
        """The topic as the sink will use it; created first when missing and auto-create-topic allows.
        ``partitions``: a topic of the sink's own (its metadata topic) created with that many partitions and used
        with whatever count it has (``partition-num`` does not apply)."""
        opts = self._opts
        try:
            found = self._describe(topic)
            created = False
            if found is None:
                if not opts.auto_create_topic:
                    raise SinkError(
                        f"topic {topic!r} does not exist on {opts.where()} and auto-create-topic=false: create it "
                        f"(with {opts.partitions_to_create} partition(s)) or set auto-create-topic=true")
                created = self._create(topic, partitions)
            if found is None or found[0] == 0:  # just created (here or elsewhere): partitions show shortly
                found = self._wait_visible(topic)
            count, limit = found
            usable = count if partitions is not None else self._usable(topic, count)
            return TopicInfo(topic, usable, self._limit(topic, limit), created, count)
        except (SinkError, SinkUnavailable):
            raise
        except Exception as exc:
            self.close()  # a broken connection is not reused
            raise wrap(exc, opts.where(), topic=topic, doing="reading topic metadata") from exc

    def _describe(self, topic: str) -> tuple[int, int | None] | None:
        """(partition count, the topic's max.message.bytes if reported), or None when the topic is missing."""
        admin = self._client()
        (meta,) = admin.describe_topics([topic])  # metadata request with auto-creation off
        code = meta.get("error_code", 0)
        if code == _UNKNOWN_TOPIC:
            return None
        if code == _LEADER_NOT_AVAILABLE:
            return 0, None  # being created
        if code:
            raise kerr.for_code(code)(f"metadata of topic {topic}")
        partitions = len(meta.get("partitions") or [])
        return partitions, (self._topic_limit(topic) if partitions else None)

    def _topic_limit(self, topic: str) -> int | None:
        from kafka.admin import ConfigResource, ConfigResourceType

        try:
            answer = self._client().describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic, configs=["max.message.bytes"])])
        except kerr.KafkaError as exc:  # not authorized to describe configs, or unsupported: max-message-bytes stands
            log.info("%s: cannot read max.message.bytes of topic %s (%s); max-message-bytes applies",
                     self._opts.where(), topic, describe(exc))
            return None
        entry = (answer.get("topic") or {}).get(topic, {}).get("max.message.bytes")
        try:
            return int(entry["value"]) if entry else None
        except (KeyError, TypeError, ValueError):
            return None

    def _create(self, topic: str, own: int | None = None) -> bool:
        opts = self._opts
        partitions = own or opts.partitions_to_create
        spec: dict[str, Any] = {"num_partitions": partitions, "replication_factor": opts.replication_factor}
        if own is None:  # a data topic: the broker's limit is the sink's (TiCDC sets it so too)
            spec["configs"] = {"max.message.bytes": str(opts.max_message_bytes)}
        answer = self._client().create_topics({topic: spec}, raise_errors=False)
        (result,) = answer["topics"]
        code = result.get("error_code", 0)
        if code == _TOPIC_EXISTS:
            log.info("topic %s on %s was created concurrently", topic, opts.where())
            return False
        if code:
            reason = result.get("error_message") or kerr.for_code(code).__name__
            err = kerr.for_code(code)(reason)
            if isinstance(err, kerr.InvalidReplicationFactorError):
                raise SinkError(f"{opts.where()} cannot create topic {topic!r} with replication-factor="
                                f"{opts.replication_factor} ({reason}): lower replication-factor to at most the "
                                "number of brokers, or create the topic yourself") from err
            raise err
        log.info("created topic %s on %s with %d partition(s), replication factor %d", topic, opts.where(),
                 partitions, opts.replication_factor)
        return True

    def _wait_visible(self, topic: str) -> tuple[int, int | None]:
        deadline = time.monotonic() + _VISIBLE_WAIT
        while True:
            found = self._describe(topic)
            if found is not None and found[0] > 0:
                return found
            if time.monotonic() > deadline:
                raise SinkUnavailable(f"topic {topic!r} on {self._opts.where()} shows no partitions in metadata "
                                      f"{_VISIBLE_WAIT:g} s after it was created (a topic with 0 partitions must be "
                                      "recreated with some)")
            self._sleep(0.1)

    def _usable(self, topic: str, partitions: int) -> int:
        wanted = self._opts.partition_num
        if wanted is None:
            return partitions
        if wanted > partitions:
            raise SinkError(f"topic {topic!r} on {self._opts.where()} has {partitions} partition(s), fewer than "
                            f"partition-num={wanted}: lower partition-num to at most {partitions}, or add partitions "
                            "to the topic (kafka-topics.sh --alter --partitions)")
        if wanted < partitions:
            log.info("topic %s has %d partitions; partition-num=%d: the sink writes to the first %d", topic,
                     partitions, wanted, wanted)
        return wanted

    def _limit(self, topic: str, topic_limit: int | None) -> int:
        ours = self._opts.max_message_bytes
        if topic_limit is not None and 0 < topic_limit < ours:
            log.info("topic %s accepts messages up to max.message.bytes=%d, below max-message-bytes=%d: the sink "
                     "uses %d", topic, topic_limit, ours, topic_limit)
            return topic_limit
        return ours

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            try:
                admin.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken client
                log.debug("closing the Kafka admin client: %s", exc)
