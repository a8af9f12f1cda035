"""``cdc cli kafka-consumer``: rebuild tables from the Kafka sink's topics into an SQL target (sinks.kafka.consumer).

    cdc cli kafka-consumer --broker 127.0.0.1:9092 --topic cdc --protocol canal-json --sink-uri sqlite:///t.db
        [--upstream postgresql://...] [--until-ts TS] [--timeout SECONDS]

Runs until ``--until-ts`` is applied (then prints a JSON summary and exits 0), until ``--timeout`` passes (exit 0
without ``--until-ts``, 1 with it), or until interrupted. ``--upstream``: exact column types from the upstream's
current schemas, and the rows of key-only messages read from it; without it the types are inferred from the
messages (docs/sinks.md, "Consumer library"). A restart resumes after what the target holds.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from typing import Any

from cdc.errors import TidewaterError
from cdc.events import TableName, TableSchema
from cdc.uri import scrub


def add_parser(groups: Any) -> None:
    p = groups.add_parser("kafka-consumer", help="rebuild tables from a Kafka sink's topics into an SQL target")
    p.add_argument("--broker", action="append", required=True, help="host:port of a broker (repeatable)")
    p.add_argument("--topic", action="append", required=True,
                   help="topic to read, every partition (repeatable: the cut is the minimum over all of them)")
    p.add_argument("--protocol", required=True, choices=("canal-json", "open-protocol", "debezium"))
    p.add_argument("--sink-uri", required=True, help="the target: sqlite:///file.db, postgresql://..., mysql://...")
    p.add_argument("--upstream", help="postgresql://... of the upstream: exact column types and key-only rows")
    p.add_argument("--until-ts", type=int, help="exit once everything up to this commit Ts is applied")
    p.add_argument("--timeout", type=float, help="give up after this many seconds")
    p.add_argument("--position", help="the consumer's position name in the target (default kafka:<topics>)")


def run(args: argparse.Namespace) -> int:
    from sinks.kafka.consumer import SinkApplier, rebuild

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    closers: list[Any] = []
    schemas = fetch = None
    try:
        if args.upstream:
            closers, schemas, fetch = _upstream(args.upstream)
        position = args.position or ("kafka:" + ",".join(args.topic))[:255]
        applier = SinkApplier(args.sink_uri, position=position, schemas=schemas, fetch_row=fetch)
        try:
            core = rebuild(args.broker, args.topic, args.protocol, applier, until=args.until_ts, timeout=args.timeout,
                           schemas=schemas, stop=stop.is_set,
                           on_cut=lambda c: logging.getLogger("cdc.kafka_consumer").info(
                               "applied up to watermark %d (%d events so far)", c.applied, c.stats.applied))
        except KeyboardInterrupt:
            return 130
        finally:
            applier.close()
    except TidewaterError as exc:
        print(json.dumps({"error_code": exc.code, "error_msg": scrub(exc.message)}, indent=2), file=sys.stderr)
        return 1
    finally:
        for c in closers:
            c.close()
    print(json.dumps({"applied_ts": core.applied, **vars(core.stats)}, indent=2))
    return 0


def _upstream(uri: str) -> tuple[list[Any], Any, Any]:
    from upstream import open_upstream

    up = open_upstream(uri)
    cache: dict[TableName, TableSchema | None] = {}
    reader = up.row_source(label="kafka-consumer")

    def schemas(table: TableName) -> TableSchema | None:
        if table not in cache:
            try:
                cache[table] = up.table_schema(table)
            except TidewaterError:
                cache[table] = None
        return cache[table]

    def fetch(table: TableName, key: dict[str, Any]) -> dict[str, Any] | None:
        schema = schemas(table)
        if schema is None:
            return None
        (row,) = reader(schema, [tuple(key[k] for k in schema.key)])
        return row

    return [reader, up], schemas, fetch
