"""Issue 25 item 2 for Kafka: the consumer library applies whole watermark cuts, so a reader of the table it rebuilds
never sees a state the upstream never had, whatever the spans and the kills did to the topic.

The bank workload of ``test_consistency_poller`` (six account tables over three spans, every transfer moving money
between tables of two different spans in one upstream transaction) goes through a Kafka changefeed (canal-json,
three partitions, rows spread over them by key) into the consumer library (``sinks.kafka.consumer.rebuild``), which
rebuilds the tables in a PostgreSQL database while the run goes on. A poller sums every balance there 20+ times a
second from the moment the opening balances arrive to the end, through a SIGKILL of a capture that is not the owner
and one of the owner (each restarted: the replays of both reach the topic again): every read must return the
constant total, and the rebuilt tables end equal to the upstream row by row."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_workload import BackgroundWriter
from test_consistency_poller import (
    ACCOUNTS,
    BANK_SCHEMA,
    READS_PER_SECOND,
    START,
    TABLES,
    TOTAL,
    WRITERS,
    Cluster,
    Poller,
    transfer,
)

from cli.kafka_consumer import upstream_lookups
from playground.cluster import current_lsn
from playground.compare import compare_tables
from playground.servers import EtcdServer, KafkaServer, PostgresServer
from sinks.kafka.applier import SinkApplier
from sinks.kafka.consumer import Rebuilder, Stats, rebuild

pytestmark = pytest.mark.e2e

DISPATCH = "[[sink.dispatchers]]\nmatcher = ['public.*']\npartition = 'index-value'\n"


@pytest.fixture
def source_schema() -> str:
    return BANK_SCHEMA


@pytest.fixture
def two_captures(etcd_server: EtcdServer, tmp_path: Any) -> Iterator[Cluster]:
    c = Cluster(etcd_server, tmp_path)
    yield c
    c.close()


class Consumer:
    """``rebuild`` in a thread of this process until ``stop``; ``applied`` is the last applied watermark."""

    def __init__(self, kafka: KafkaServer, topic: str, target: str, upstream: str) -> None:
        self.closers, schemas, fetch = upstream_lookups(upstream)
        self.applier = SinkApplier(target, position=f"kafka:{topic}", schemas=schemas, fetch_row=fetch)
        self.applied = 0
        self.stats = Stats()
        self.error: BaseException | None = None
        self.halt = threading.Event()

        def cut(core: Rebuilder) -> None:
            self.applied = core.applied
            self.stats = core.stats

        def run() -> None:
            try:
                rebuild([kafka.bootstrap], [topic], "canal-json", self.applier, schemas=schemas,
                        stop=self.halt.is_set, on_cut=cut)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread by wait()
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait(self, ts: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.applied < ts:
            if self.error is not None:
                raise AssertionError(f"the consumer stopped: {self.error!r}") from self.error
            assert time.monotonic() < deadline, f"the consumer applied up to {self.applied}, not {ts}, in {timeout}s"
            time.sleep(0.1)

    def caught_up(self, source: Any, at_least: float) -> None:
        """Let the transfers run ``at_least`` seconds and until this consumer has applied a cut at or above the
        upstream's position as of now: after a kill, the next one comes only once the pipeline has recovered."""
        t0, lsn = time.monotonic(), current_lsn(source)
        self.wait(lsn)
        time.sleep(max(0.0, at_least - (time.monotonic() - t0)))

    def close(self) -> None:
        self.halt.set()
        self.thread.join(30)
        self.applier.close()
        for c in self.closers:
            c.close()


def test_the_consumer_applies_whole_cuts_no_torn_reads_through_two_kills(
        two_captures: Cluster, kafka_server: KafkaServer, kafka_topic: str, pg_server: PostgresServer,
        pg_database: str, source: Any) -> None:
    cluster = two_captures
    upstream = pg_server.uri(pg_database)
    sink = kafka_server.uri(kafka_topic, protocol="canal-json", partition_num="3")
    cluster.any().create_changefeed("bankk", upstream, sink, "span-count = 3\n" + DISPATCH, snapshot="none")
    target_db = f"rebuilt_{uuid.uuid4().hex[:10]}"
    pg_server.create_database(target_db)
    target = str(pg_server.uri(target_db))
    with source.cursor() as cur:  # the opening balances: one upstream transaction over every table
        cur.execute("BEGIN")
        for t in TABLES:
            cur.execute(f"INSERT INTO {t} SELECT g, {START} FROM generate_series(0, {ACCOUNTS - 1}) g")
        cur.execute("COMMIT")
    opened = current_lsn(source)
    consumer = Consumer(kafka_server, kafka_topic, target, upstream)
    try:
        consumer.wait(opened)  # (every table exists downstream from here: the poller's sum can run)
        with Poller(target) as poller:
            writers = [BackgroundWriter(pg_server.connect(pg_database), transfer, start=i * 10**6, pause=0.01)
                       for i in range(WRITERS)]
            for w in writers:
                w.start()
            try:
                consumer.caught_up(source, 3)
                cluster.kill(1 - cluster.owner())  # spans only
                consumer.caught_up(source, 2)
                cluster.kill(cluster.owner())  # spans and the owner's checkpoint watermarks
                consumer.caught_up(source, 2)
            finally:
                for w in writers:
                    w.finish()
                    w.conn.close()
            end = current_lsn(source)
            checkpoint = cluster.any().wait_checkpoint("bankk", end, timeout=120)["checkpoint_ts"]
            consumer.wait(checkpoint)
            time.sleep(0.5)  # a few reads of the final state
        assert sum(w.txns for w in writers) > 50, [w.txns for w in writers]
    finally:
        consumer.close()
    print(f"\nkafka consumer: {len(poller.totals)} reads ({poller.rate:.1f}/s), {len(poller.torn)} torn, "
          f"{len(poller.errors)} failed; polls read again from a hole in the broker's answer: "
          f"{consumer.stats.holes_reread}, offset gaps: {consumer.stats.offset_gaps} + "
          f"{consumer.stats.txn_marker_gaps} of one")
    for diff in compare_tables(source, [f"public.{t}" for t in TABLES], target):
        assert diff.equal and diff.source_rows == diff.target_rows == ACCOUNTS, diff
    assert poller.rate >= READS_PER_SECOND, poller.errors[:5]
    assert poller.errors == [], poller.errors[:5]
    assert poller.torn == [], f"{len(poller.torn)} of {len(poller.totals)} reads saw a total that never existed"
    assert poller.totals and all(t == TOTAL for t in poller.totals)
