"""The one Kafka record header the sink adds, ``tidewater``, and its parsing (used by the consumer library).

Value (ASCII):

- a row or DDL message: ``<span>/<spans>:<seq>[,<seq>...]``: the span that wrote it (0-based) of how many, and the
  event position of each event in it, in order (``sinks.kafka.sink``: per span and commit Ts, a replay numbers its
  events as the first run did). Writers of the initial copy are bound to no span: ``-:<seq>...``.
- a span's watermark: ``<span>/<spans>``. The changefeed checkpoint's watermarks (the owner's) carry no header.

One header, not two: kafka-python's cost per header is ~2 us per message, a tenth of the sink's budget.
"""

from __future__ import annotations

from collections.abc import Sequence

HEADER = "tidewater"


def row_header(span: bytes | None, seqs: Sequence[int]) -> tuple[str, bytes]:
    """The header of a row or DDL message; ``span`` as :func:`span_value` gives it (None: unbound)."""
    text = str(seqs[0]) if len(seqs) == 1 else ",".join(map(str, seqs))
    return HEADER, (span or b"-") + b":" + text.encode()


def span_value(span: int, spans: int) -> bytes:
    return f"{span}/{spans}".encode()


def parse(value: bytes | None) -> tuple[str | None, list[int]]:
    """``(span text "i/n" or None, event positions)`` of a header value (None: no header)."""
    if not value:
        return None, []
    text = value.decode("ascii")
    span, _, seqs = text.partition(":")
    return (None if span in ("", "-") else span), ([int(s) for s in seqs.split(",")] if seqs else [])
