"""kafka-python's exceptions mapped once into :mod:`cdc.errors` (the transport's boundary).

- Retryable (:class:`SinkUnavailable`): brokers unreachable or not answering in time (connection errors,
  ``KafkaTimeoutError``, expired batches), leaders moving, too few in-sync replicas, a producer id the broker no
  longer knows (after a broker restart), and every other error kafka-python marks retriable.
- :class:`SinkFenced` (retryable): a newer producer took over the transactional id.
- Fatal (:class:`SinkError`): a message or request too large (``sinks.codec.MessageTooLarge``), authorization or authentication refused, an
  invalid topic, partition count or replication factor, an unsupported feature; anything not known to be
  transient. The message names the topic (and the size and limit for a too-large message) and the fix.
"""

from __future__ import annotations

from kafka import errors as kerr

from cdc.errors import SinkError, SinkFenced, SinkUnavailable, TidewaterError
from cdc.uri import scrub
from sinks.codec.base import MessageTooLarge

_UNAVAILABLE = (
    kerr.KafkaConnectionError, kerr.KafkaTimeoutError, kerr.NodeNotReadyError, kerr.RequestTimedOutError,
    kerr.NotEnoughReplicasError, kerr.NotEnoughReplicasAfterAppendError, kerr.LeaderNotAvailableError,
    kerr.NotLeaderForPartitionError, kerr.BrokerNotAvailableError, kerr.UnknownProducerIdError,
    kerr.OutOfOrderSequenceNumberError, kerr.CoordinatorNotAvailableError, kerr.NotCoordinatorError,
    kerr.ConcurrentTransactionsError, kerr.InvalidTxnStateError, kerr.TransactionAbortedError, kerr.Cancelled,
)
_FENCED = (kerr.ProducerFencedError, kerr.InvalidProducerEpochError, kerr.TransactionCoordinatorFencedError)
_TOO_LARGE = (kerr.MessageSizeTooLargeError, kerr.RecordListTooLargeError)


def describe(exc: BaseException) -> str:
    """One line for a kafka-python error, without the request dump some of them carry."""
    text = str(exc).split(": Request '", 1)[0].strip() or type(exc).__name__
    return scrub(" ".join(text.split()))[:300]


def wrap(exc: BaseException, where: str, *, topic: str | None = None, size: int | None = None,
         limit: int | None = None, doing: str = "sending") -> TidewaterError:
    """``exc`` (from kafka-python) as a :class:`TidewaterError`; ``where`` is ``Kafka at h:p``. A
    TidewaterError is returned as it is."""
    if isinstance(exc, TidewaterError):
        return exc
    on = f" topic {topic}" if topic else ""
    what = describe(exc)
    if isinstance(exc, _FENCED):
        return SinkFenced(f"{where}: the transactional producer{on} was fenced by a newer one with the same "
                          f"transactional id (the span's next owner); nothing of this write was committed ({what})",
                          cause=exc)
    if isinstance(exc, _TOO_LARGE):
        sized = f" ({size} bytes" + (f", limit {limit}" if limit else "") + ")" if size else ""
        return MessageTooLarge(f"{where} refused a message{on}{sized} as too large: raise the topic's max.message.bytes "
                         f"(and the brokers' message.max.bytes) or lower max-message-bytes in the sink URI so that "
                         f"the sink refuses it first ({what})", cause=exc)
    if isinstance(exc, kerr.AuthorizationError):
        return SinkError(f"{where} refused {doing}{on}: not authorized ({what}); grant the sink's principal Describe, "
                         "Write and (with auto-create-topic) Create on the topic, IdempotentWrite on the cluster and, "
                         "with kafka-transactional, Write on its transactional id", cause=exc)
    if isinstance(exc, kerr.SaslAuthenticationFailedError):
        return SinkError(f"{where}: SASL authentication failed ({what}); check sasl-user, sasl-password and "
                         "sasl-mechanism", cause=exc)
    if isinstance(exc, kerr.UnknownTopicOrPartitionError):
        return SinkUnavailable(f"{where}:{on or ' the topic'} or its partition is unknown to the broker ({what})",
                               cause=exc)
    if isinstance(exc, _UNAVAILABLE) or (isinstance(exc, kerr.KafkaError) and exc.retriable):
        return SinkUnavailable(f"{where} unavailable while {doing}{on}: {what}", cause=exc)
    if isinstance(exc, OSError):
        return SinkUnavailable(f"{where} unreachable while {doing}{on}: {what}", cause=exc)
    return SinkError(f"{where} failed {doing}{on}: {what}", cause=exc)
