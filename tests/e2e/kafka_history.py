"""What an exactly-once Kafka run must be compared with, without Tidewater's help.

- :func:`open_history` / :func:`read_history`: the upstream's exact change history, from a ``test_decoding`` slot of
  its own (PostgreSQL's plugin, not Tidewater's decoder): per committed change ``(commit Ts, table, op, key)``, the
  commit Ts being the commit's end LSN (what Tidewater stamps), the key the key columns' text (a key-less table's:
  the whole row).
- :func:`read_topic`: every record of a topic as a plain kafka-python ``read_committed`` consumer gets it (no
  Tidewater header or library used), and :func:`canal_changes` the canal-json data messages as the same tuples.

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


def read_topic(bootstrap: str, topic: str, *, quiet: float = 3.0, timeout: float = 60.0) -> list[Any]:
    """Every record of every partition of ``topic``, from the beginning, with ``read_committed``, until nothing new
    came for ``quiet`` seconds (tansu's end offsets are wrong: read until quiet)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False,
                             group_id=None, auto_offset_reset="earliest")
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        last, deadline = time.monotonic(), time.monotonic() + timeout
        while time.monotonic() - last < quiet and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300).values():
                out.extend(records)
                last = time.monotonic()
        return out
    finally:
        consumer.close()


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
