"""``cdc cli kafka-consumer``: rebuild tables from the Kafka sink's topics into an SQL target (sinks.kafka.consumer).

    cdc cli kafka-consumer --broker 127.0.0.1:9092 --topic cdc --protocol canal-json --sink-uri sqlite:///t.db
        [--upstream postgresql://...] [--until-ts TS] [--timeout SECONDS]
    cdc cli kafka-consumer --kafka-uri 'kafka://b1:9093/cdc?protocol=canal-json&enable-tls=true&ca=/ca.pem&...' \
        --sink-uri sqlite:///t.db

``--kafka-uri`` (or ``--kafka-uri-file FILE``, or ``$TIDEWATER_KAFKA_URI``: no password in ``ps``) is the
changefeed's own sink URI: the brokers, the topic (unless ``--topic`` names others), the protocol and its options,
TLS (``enable-tls``, ``ca``, ``cert``, ``key``, ``insecure-skip-verify``) and SASL (``sasl-mechanism``,
``sasl-user``, ``sasl-password``) are taken from it, so the consumer decodes what the sink encodes.

Runs until ``--until-ts`` is applied (then prints a JSON summary and exits 0), until ``--timeout`` passes (exit 0
without ``--until-ts``, 1 with it), or until interrupted. ``--upstream``: exact column types from the upstream's
current schemas, and the rows of key-only messages read from it; without it the types are inferred from the
messages (docs/sinks.md, "Consumer library"). A table is created at its CREATE TABLE message from the schema in the
Tidewater sink's ``tidewater-ddl`` header (so an empty one too; a target table of another shape stops the consumer,
exit 1, naming both shapes), and, from other producers, at its first row. A restart resumes after what the target
holds.

Copies are checked (``sinks.kafka.copy_markers``): the consumer reads the sink's metadata topic (``--meta-topic``) and
stops (exit 1, the error naming the table, the chunk, the topic and partition, expected and seen rows) rather than
rebuild a table whose copy arrived short. Its summary counts ``chunks_verified``, ``copied_rows`` and the offset
gaps it saw.

Its flags are parsed with every other command's in :mod:`cli.main`, which imports this module (kafka-python with it)
only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import TidewaterError
from cdc.events import TableName, TableSchema
from cdc.uri import scrub
from cli.args import CliError, uri_arg
from sinks.codec import EncoderConfig
from sinks.kafka.applier import SinkApplier
from sinks.kafka.consumer import rebuild
from sinks.kafka.meta import meta_topic_name
from sinks.kafka.options import CODEC_PARAMS, parse_kafka_uri
from sinks.kafka.sink import SINK_PARAMS
from sinks.kafka.transport import security_config
from upstream import open_upstream

ENV_KAFKA_URI = "TIDEWATER_KAFKA_URI"


@dataclass(frozen=True)
class Source:
    """Where the consumer reads: brokers, topics, protocol, its codec options and kafka-python's TLS/SASL settings."""

    brokers: list[str]
    topics: list[str]
    protocol: str
    codec: EncoderConfig | None = None
    client: dict[str, Any] = field(default_factory=dict)
    meta_topic: str | None = None  # the sink's metadata topic (None: the first topic's)


def source_of(args: argparse.Namespace) -> Source:
    """The :class:`Source` of the arguments; :class:`CliError` (exit 2) naming what is missing or wrong."""
    raw = uri_arg(args, "kafka_uri", ENV_KAFKA_URI, "Kafka sink URI", required=False)
    if raw is None:
        if not args.broker or not args.topic or not args.protocol:
            raise CliError("CDC:ErrUsage", "give --kafka-uri (the changefeed's kafka:// sink URI), or --broker, "
                           "--topic and --protocol", 2)
        return Source(list(args.broker), list(args.topic), args.protocol, meta_topic=args.meta_topic)
    if args.broker:
        raise CliError("CDC:ErrUsage", "--broker and --kafka-uri both name brokers: give one of them", 2)
    try:
        opts = parse_kafka_uri(raw, codec_params=(*CODEC_PARAMS, *SINK_PARAMS))
        codec = EncoderConfig.from_params({k: v for k, v in opts.codec_params.items() if k not in SINK_PARAMS},
                                          base=EncoderConfig(max_message_bytes=opts.max_message_bytes))
    except TidewaterError as exc:
        raise CliError(exc.code, exc.message, 2) from exc
    if args.protocol and args.protocol != opts.protocol:
        raise CliError("CDC:ErrUsage", f"--protocol {args.protocol} differs from the URI's protocol={opts.protocol}", 2)
    return Source(list(opts.brokers), list(args.topic or [opts.topic]), opts.protocol, codec, security_config(opts),
                  args.meta_topic or meta_topic_name(opts.topic))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    closers: list[Any] = []
    schemas = fetch = reader = None
    try:
        src = source_of(args)
    except CliError as exc:
        print(json.dumps({"error_code": exc.code, "error_msg": scrub(exc.message)}, indent=2), file=sys.stderr)
        return exc.exit_code
    try:
        if args.upstream:
            closers, schemas, fetch = upstream_lookups(args.upstream)
            reader = closers[0]
        position = args.position or ("kafka:" + ",".join(src.topics))[:255]
        applier = SinkApplier(args.sink_uri, position=position, schemas=schemas, fetch_row=fetch, row_source=reader)
        try:
            core = rebuild(src.brokers, src.topics, src.protocol, applier, until=args.until_ts, timeout=args.timeout,
                           schemas=schemas, codec=src.codec, client=src.client, stop=stop.is_set,
                           meta_topic=src.meta_topic,
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


def upstream_lookups(uri: str) -> tuple[list[Any], Any, Any]:
    """What the consumer needs of the upstream at ``uri``: ``(closers, schemas, fetch)``, the things to close
    when done (the row reader first), the table schema lookup (cached; None for a table it cannot read) and the
    fetch of one current row by key (None if it is gone)."""
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
