"""Reading partitions from their first record without asking the broker where that is.

A reader that must see every record of a partition (the consumer library rebuilding tables, the sink reading its
metadata topic) starts at offset 0 itself instead of ``seek_to_beginning`` (ListOffsets EARLIEST). The test broker
answers EARLIEST with the batch it *stored* first, not the lowest offset (tansu 0.6, ``dynostore.rs``
``list_offsets``: the object with the oldest ``last_modified``), and it assigns a batch's offset before it stores the
batch. Two producers writing the first batches of a partition at once can be stored in the other order; EARLIEST is
then the later batch's offset and a consumer starting there never sees the batches before it. That is how a
Kafka changefeed's consumer lost the initial copy's rows of one table in one partition under load (issue 20: the
copy writers, the span and the owner all write the first batches of each partition within milliseconds).

On a broker whose log no longer starts at 0 (retention deleted records) offset 0 is out of range: the consumer is
created with ``auto_offset_reset="none"`` (:data:`RESET`) so that it raises instead of jumping, and
:func:`out_of_range` turns that into an error naming the partition: a rebuild from such a topic misses records.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cdc.errors import SinkError

FIRST_OFFSET = 0
RESET = "none"  # kafka-python's auto_offset_reset: raise OffsetOutOfRangeError rather than move the position


def seek_to_start(consumer: Any, partitions: Iterable[Any]) -> None:
    """Position ``consumer`` at offset 0 of each of ``partitions`` (kafka-python ``TopicPartition`` s, assigned)."""
    for tp in partitions:
        consumer.seek(tp, FIRST_OFFSET)


def out_of_range(exc: Exception, where: str) -> SinkError | None:
    """The error to raise for kafka-python's ``OffsetOutOfRangeError`` (None for any other exception)."""
    from kafka.errors import OffsetOutOfRangeError

    if not isinstance(exc, OffsetOutOfRangeError):
        return None
    parts = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    named = ", ".join(f"{tp.topic} partition {tp.partition}" for tp in parts) or "a partition"
    return SinkError(f"{where}: {named} no longer starts at offset 0 on the broker (records were deleted, e.g. by "
                     "retention): reading it would miss the records before its first offset, so nothing is read. "
                     "Rebuild from a resync (cdc cli changefeed snapshot --table), or keep the topic's records "
                     "(retention.ms = -1) for consumers that rebuild from the start")
