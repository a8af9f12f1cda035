"""What an exactly-once Kafka run must be compared with, without Tidewater's help.

- :func:`open_history` / :func:`read_history`: the upstream's exact change history, from a ``test_decoding`` slot of
  its own (PostgreSQL's plugin, not Tidewater's decoder): per committed change ``(commit Ts, table, op, key)``, the
  commit Ts being the commit's end LSN (what Tidewater stamps), the key the key columns' text (a key-less table's:
  the whole row).
- :func:`read_topic`: every record of a topic as a plain kafka-python ``read_committed`` consumer gets it (no
  Tidewater header or library used), and the same filtered by the log's own transaction markers (what Apache
  Kafka's ``read_committed`` returns: tansu 0.6 writes the markers but lets aborted records through);
  :func:`canal_changes` the canal-json data messages as the same tuples.

The difference of the two multisets is the run's duplicates and losses.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Any

Change = tuple[int, str, str, tuple[tuple[str, str], ...]]  # (commit Ts, table, op, key)
NULL = "\\N"

_LINE = re.compile(r'^table (?P<table>.+?): (?P<op>INSERT|UPDATE|DELETE|TRUNCATE):\s?(?P<rest>.*)$', re.DOTALL)
_FIELD = re.compile(r"""(?P<name>"(?:[^"]|"")*"|[^\s\[]+)\[(?P<type>[^\]]*)\]:(?P<val>'(?:[^']|'')*'|\S+)""")


def _ident(text: str) -> str:
    return text[1:-1].replace('""', '"') if text.startswith('"') else text


def _tuple(text: str) -> dict[str, str]:
    out = {}
    for m in _FIELD.finditer(text):
        v = m.group("val")
        out[_ident(m.group("name"))] = v[1:-1].replace("''", "'") if v.startswith("'") else (NULL if v == "null"
                                                                                              else v)
    return out


def _table(text: str) -> str:
    schema, _, table = text.partition(".")
    return f"{_ident(schema)}.{_ident(table)}"


def _lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def open_history(conn: Any, slot: str) -> None:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))


def read_history(conn: Any, slot: str, keys: dict[str, tuple[str, ...]], *, drop: bool = True) -> Counter[Change]:
    """Every change since :func:`open_history` of the tables in ``keys`` (table -> key columns; () for a key-less
    table: the whole row). An UPDATE that changes a keyed row's key counts as a DELETE and an INSERT (how the Kafka
    sink writes it)."""
    with conn.cursor() as cur:
        cur.execute("SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", (slot,))
        rows = cur.fetchall()
        if drop:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    out: Counter[Change] = Counter()
    pending: list[tuple[str, str, tuple[tuple[str, str], ...]]] = []
    for lsn, data in rows:
        if data.startswith("BEGIN"):
            pending = []
        elif data.startswith("COMMIT"):
            ts = _lsn(lsn)
            out.update((ts, t, op, k) for t, op, k in pending)
        else:
            m = _LINE.match(data)
            if m is None or _table(m.group("table")) not in keys:
                continue
            table, op, rest = _table(m.group("table")), m.group("op"), m.group("rest")
            key = keys[table]

            def ident(row: dict[str, str], key: tuple[str, ...] = key) -> tuple[tuple[str, str], ...]:
                return tuple((c, row.get(c, NULL)) for c in key) if key else tuple(sorted(row.items()))

            if op == "UPDATE" and "old-key:" in rest and key:
                old, _, new = rest.partition("new-tuple:")
                before, after = _tuple(old.replace("old-key:", "")), _tuple(new)
                if ident(before) != ident(after):
                    pending += [(table, "DELETE", ident(before)), (table, "INSERT", ident(after))]
                    continue
                pending.append((table, op, ident(after)))
            elif op == "UPDATE" and "new-tuple:" in rest:
                pending.append((table, op, ident(_tuple(rest.partition("new-tuple:")[2]))))
            else:
                pending.append((table, op, ident(_tuple(rest))))
    return out


class _BatchSpy:
    """Wraps the record set kafka-python's fetcher unpacks: notes each batch's producer, transactional flag and
    commit/abort marker (the broker's own transaction record), and changes nothing of what the consumer returns."""

    def __init__(self, records: Any, tp: Any, log: list[tuple[Any, ...]]) -> None:
        self._records, self._tp, self._log = records, tp, log

    def next_batch(self) -> Any:
        b = self._records.next_batch()
        if b is not None and getattr(b, "magic", 0) == 2 and b.has_producer_id():
            # the marker's record read from a copy of the batch (the fetcher validates and reads the batch itself)
            abort = next(iter(type(b)(b._buffer))).abort if b.is_control_batch else None  # noqa: SLF001
            self._log.append((self._tp.topic, self._tp.partition, b.base_offset, b.last_offset, b.producer_id,
                              b.is_transactional, b.is_control_batch, abort))
        return b

    def __getattr__(self, name: str) -> Any:
        return getattr(self._records, name)


def not_committed(batches: list[tuple[Any, ...]]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """Per partition, the offset ranges of transactional batches that the log's own markers say were aborted, or that
    no marker ended (an open transaction): what a Kafka broker keeps from ``read_committed`` consumers (its fetch
    answer lists the aborted transactions; tansu 0.6 writes the markers but does not list them)."""
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    by_part: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for b in batches:
        by_part.setdefault((b[0], b[1]), []).append(b)
    for part, items in by_part.items():
        pending: dict[int, list[tuple[int, int]]] = {}
        seen: set[int] = set()
        for _, _, base, last, pid, txn, control, abort in sorted(items, key=lambda b: b[2]):
            if base in seen:
                continue  # the same batch fetched twice
            seen.add(base)
            if control:
                ranges = pending.pop(pid, [])
                if abort:
                    out.setdefault(part, []).extend(ranges)
            elif txn:
                pending.setdefault(pid, []).append((base, last))
        for ranges in pending.values():
            out.setdefault(part, []).extend(ranges)
    return out


def read_topic(bootstrap: str, topic: str, *, quiet: float = 3.0, timeout: float = 60.0
               ) -> tuple[list[Any], list[Any]]:
    """Every record of every partition of ``topic``, from the beginning, as a plain kafka-python ``read_committed``
    consumer returns them, until nothing new came for ``quiet`` seconds (tansu's end offsets are wrong: read until
    quiet); and the same without the records the log's own transaction markers say were aborted or never committed
    (:func:`not_committed`: what Kafka's ``read_committed`` returns; the same list on a broker that hides them)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.consumer.fetcher import Fetcher

    batches: list[tuple[Any, ...]] = []
    cls = Fetcher.PartitionRecords
    unpack = cls._unpack_records
    cls._unpack_records = lambda self, tp, records, kd, vd: unpack(self, tp, _BatchSpy(records, tp, batches), kd, vd)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False,
                             group_id=None, auto_offset_reset="earliest")
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        for tp in tps:  # from offset 0, not the broker's EARLIEST (tansu: sinks/kafka/logstart.py)
            consumer.seek(tp, 0)
        out: list[Any] = []
        last, deadline = time.monotonic(), time.monotonic() + timeout
        while time.monotonic() - last < quiet and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300).values():
                out.extend(records)
                last = time.monotonic()
    finally:
        consumer.close()
        cls._unpack_records = unpack
    hidden = not_committed(batches)

    def committed(r: Any) -> bool:
        return not any(lo <= r.offset <= hi for lo, hi in hidden.get((r.topic, r.partition), ()))

    return out, [r for r in out if committed(r)]


def canal_changes(records: list[Any], keys: dict[str, tuple[str, ...]]) -> list[Change]:
    """The canal-json data messages among ``records`` as ``(commit Ts, table, op, key)`` (DDL and watermarks left
    out; headers not read)."""
    out = []
    for r in records:
        if r.value is None:
            continue
        msg = json.loads(r.value)
        if msg.get("isDdl") or msg.get("type") not in ("INSERT", "UPDATE", "DELETE"):
            continue
        table = f"{msg['database']}.{msg['table']}"
        if table not in keys:
            continue
        ts = int(msg["_tidb"]["commitTs"])
        for row in msg.get("data") or ():
            text = {k: NULL if v is None else str(v) for k, v in row.items()}
            key = keys[table]
            out.append((ts, table, msg["type"], tuple((c, text.get(c, NULL)) for c in key) if key
                        else tuple(sorted(text.items()))))
    return out


def dump_topics(bootstrap: str, topic: str, path: Any) -> None:
    """Every record of ``topic`` and of its metadata topic, by partition and offset, with headers (a failed run's
    post-mortem: which offsets the broker holds against what the producers were acknowledged)."""
    from sinks.kafka.meta import meta_topic_name

    with open(path, "w") as f:
        for name in (topic, meta_topic_name(topic)):
            records, _ = read_topic(bootstrap, name, quiet=1.5)
            for r in sorted(records, key=lambda r: (r.partition, r.offset)):
                f.write(f"{name} {r.partition} {r.offset} {dict(r.headers or [])} {r.key!r} "
                        f"{(r.value or b'')[:400]!r}\n")
    print(f"the topics' records are in {path}")
