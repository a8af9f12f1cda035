"""Rows whose message is larger than the topic allows (``large-message-handle-option``), for the Kafka sink.

:class:`LargeMessages` is the option as parsed from the sink URI and what it does with one oversized row message:

- ``none`` (the default; always for Debezium, which has no key-only form): :class:`sinks.codec.MessageTooLarge`
  naming the table, the key, the size and the limit. The row is not sent and the write fails: never a silent drop.
- ``handle-key-only``: TiCDC's key-only form of the row (its key columns and the event's position).
- ``claim-check``: the full message is first stored under ``claim-check-storage-uri`` (a local ``file://``
  directory: written, fsynced, renamed, directory fsynced), then the key-only form carrying its location is sent.
  The file's name depends only on the event (commit Ts, span, position), so a replay overwrites the same file.

A key-only message that is still too large fails the same way as ``none``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cdc.errors import InvalidURI, SinkError
from cdc.events import RowChange
from sinks.codec import EncodeError, Message, MessageKind, MessageTooLarge
from sinks.codec.base import RowEventEncoder

log = logging.getLogger(__name__)

LARGE_MESSAGE_OPTIONS = ("none", "handle-key-only", "claim-check")


@dataclass(frozen=True)
class LargeMessages:
    """``large-message-handle-option`` and ``claim-check-storage-uri`` of one sink (see the module docstring)."""

    option: str = "none"
    claim_dir: Path | None = None

    @classmethod
    def from_params(cls, params: dict[str, str], protocol: str, shown: str) -> LargeMessages:
        """Take the two parameters out of ``params``; :class:`InvalidURI` naming the fix when they do not fit."""
        option = params.pop("large-message-handle-option", "none")
        if option not in LARGE_MESSAGE_OPTIONS:
            raise InvalidURI(f"sink URI {shown!r}: large-message-handle-option={option!r} is not supported: use one "
                             f"of {', '.join(LARGE_MESSAGE_OPTIONS)}")
        claim_dir = _claim_check_dir(params.pop("claim-check-storage-uri", None), option, shown)
        if protocol == "debezium" and option != "none":
            raise InvalidURI(f"sink URI {shown!r}: large-message-handle-option={option} needs a protocol with a "
                             "key-only form (canal-json or open-protocol); Debezium has none")
        return cls(option, claim_dir)

    def shrink(self, msg: Message, change: RowChange | None, seq: int, *, protocol: str, enc: RowEventEncoder,
               size: int, limit: int, topic: str, partition: int, span: int | None,
               headers: Callable[[Message], list[tuple[str, bytes]]],
               measure: Callable[[Message, list[tuple[str, bytes]]], int]) -> tuple[Message, list[tuple[str, bytes]]]:
        """The message to send instead of ``msg`` (``size`` bytes, over ``limit``) and its headers, or
        :class:`MessageTooLarge`. ``headers(m)`` gives a message's headers, ``measure(m, h)`` its size on the wire."""
        what = (f"table {msg.table}: the {change.op.name if change else msg.kind.value} of key "
                f"{_key_text(msg, change)} at commit Ts {msg.commit_ts}")
        if change is None or msg.kind is not MessageKind.ROW or self.option == "none":
            raise MessageTooLarge(
                f"{what} is a {size}-byte {protocol} message, above the limit of {limit} bytes for topic {topic}: not "
                "sent. Raise max-message-bytes (and the topic's max.message.bytes), or send oversized rows in key-only "
                "form: large-message-handle-option=handle-key-only or claim-check (canal-json, open-protocol)")
        location = None
        if self.option == "claim-check":
            location = self._store(msg, seq, topic, partition, span, headers(msg))
        try:
            small = enc.encode_key_only(change, location)
        except EncodeError as exc:
            raise MessageTooLarge(f"{what} is a {size}-byte message, above the limit of {limit} bytes for topic "
                                  f"{topic}, and has no key-only form ({exc.message}): not sent") from exc
        small_headers = headers(small)
        small_size = measure(small, small_headers)
        if small_size > limit:
            raise MessageTooLarge(f"{what} is too large even in key-only form ({small_size} bytes, limit {limit} for "
                                  f"topic {topic}): not sent; raise max-message-bytes")
        log.info("%s: %d bytes over the %d-byte limit, sent %s", what, size, limit,
                 f"as a claim check ({location})" if location else "in key-only form")
        return small, small_headers

    def _store(self, msg: Message, seq: int, topic: str, partition: int, span: int | None,
               headers: list[tuple[str, bytes]]) -> str:
        """Store the full message durably (write, fsync, rename, fsync the directory); return its location."""
        assert self.claim_dir is not None
        name = f"{msg.commit_ts}-{span if span is not None else 'x'}-{seq}.json"
        directory = self.claim_dir / _safe(topic) / str(partition)
        doc = {"key": _b64(msg.key), "value": _b64(msg.value), "headers": [[k, _b64(v)] for k, v in headers],
               "topic": topic, "partition": partition, "commit_ts": msg.commit_ts}
        try:
            directory.mkdir(parents=True, exist_ok=True)
            final = directory / name
            tmp = directory / f".{name}.tmp"
            with open(tmp, "wb") as f:
                f.write(json.dumps(doc).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise SinkError(f"table {msg.table}: cannot store the claim-check message under {self.claim_dir}: "
                            f"{exc}") from exc
        return final.as_uri()


def _claim_check_dir(raw: str | None, option: str, shown: str) -> Path | None:
    if option != "claim-check":
        if raw:
            raise InvalidURI(f"sink URI {shown!r}: claim-check-storage-uri is used only with "
                             "large-message-handle-option=claim-check")
        return None
    if not raw:
        raise InvalidURI(f"sink URI {shown!r}: large-message-handle-option=claim-check needs claim-check-storage-uri="
                         "file:///a/local/directory (where the full messages are stored)")
    parsed = urllib.parse.urlsplit(raw)
    if parsed.scheme != "file" or not parsed.path.startswith("/") or parsed.netloc not in ("", "localhost"):
        raise InvalidURI(f"sink URI {shown!r}: claim-check-storage-uri={raw!r} must be a local directory as "
                         "file:///absolute/path (other storages are not supported yet)")
    return Path(urllib.parse.unquote(parsed.path))


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:120]


def _key_text(msg: Message, change: RowChange | None) -> str:
    if msg.row_key is not None:
        names = change.schema.key if change is not None else ()
        if len(names) == len(msg.row_key):
            return "(" + ", ".join(f"{n}={v!r}" for n, v in zip(names, msg.row_key, strict=True)) + ")"
        return repr(msg.row_key)
    return "(no key)"
