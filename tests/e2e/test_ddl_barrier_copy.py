"""End to end: a table renamed onto another span's name while its initial copy runs (docs/ddl.md, "A table renamed
during its initial copy", "Still refused loudly").

Two spans: ``stock`` (and ``orders``) in span 0, ``fresh`` (and ``audit``) in span 1. ``DROP TABLE stock; ALTER
TABLE fresh RENAME TO stock`` commits while span 1's initial copy runs: made certain, not load-dependent, by a lock
on span 1's downstream ``audit`` (pre-created, empty; SHARE mode takes no transaction id upstream or down): its
copy job waits inside ``audit``'s chunks (copied before ``fresh``: tables in name order, more chunks than the job
has threads) until the DDL has committed.

- Without a restart the job then reads ``fresh`` by its relation oid, as of the snapshot it was planned under
  (before the DDL), into the downstream ``fresh``; span 1's stream applies the rename at the changefeed barrier
  after span 0's ``DROP TABLE stock``: ``normal`` throughout, nothing skipped, equal. (Before the read by oid, the
  job failed on ``fresh``, the next run planned ``stock`` after the DDL and ran ahead of the barrier.)
- With the capture SIGKILLed at that point, the next run cannot import the old snapshot again and plans ``stock``
  at a snapshot after the DDL: ahead of span 0's barrier. Span 0 refuses with ``CDC:ErrSnapshotTableChanged``
  (``processor/barrier.py``; measured without that guard: the changefeed ``normal`` past the DDL with ``stock`` gone
  downstream) and the fix it names (skip the DDL, resume, resync ``public.stock``) ends equal.

Into PostgreSQL the job copies ``fresh`` into a target it creates without its key (docs/snapshot.md, "The key after
the load"); a failed read of a renamed table used to come back from that path as the target's fatal error
(``CDC:ErrSinkFatal``), so the copy was never retried (fixed in sinks/sql/ops/deferred_key.py;
tests/integration/test_snapshot_deferred_key.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import assert_converged, make_sink_uri, run_sql, wait_for

from cdc.events import TableName
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.meta.store import MetaStore
from cdc.model import SpanSnapshot
from cdc.spans import span_of
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SPANS = 2
SCHEMA = """
CREATE TABLE stock (id int PRIMARY KEY, v text);
CREATE TABLE orders (id int PRIMARY KEY, v text);
CREATE TABLE audit (id int PRIMARY KEY, v text);
CREATE TABLE fresh (id int PRIMARY KEY, v text);
INSERT INTO stock SELECT g, 'old stock ' || g FROM generate_series(1, 20) g;
INSERT INTO orders SELECT g, 'order ' || g FROM generate_series(1, 20) g;
INSERT INTO audit SELECT g, 'audit ' || g FROM generate_series(1, 40) g;
INSERT INTO fresh SELECT g, 'fresh ' || g FROM generate_series(101, 130) g;
"""
# audit: 4 chunks, before fresh's, for the job's 2 threads (local[2]); no Spark start for tables this small
CONFIG = f'span-count = {SPANS}\n[snapshot]\nchunk-rows = 10\nspark-master = "local[2]"\n'
TABLES = ["public.stock", "public.orders", "public.audit"]


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


@pytest.fixture(params=["postgresql"])  # the hold-back uses PostgreSQL's table locks on the target
def sink_uri(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    return make_sink_uri(request.param, request, tmp_path, pg_server)


def _cli(cdc: CdcServer, *args: str) -> Any:
    proc = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", cdc.url, *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc
    return json.loads(proc.stdout)


def _waiting_on_lock(pg_server: PostgresServer, db: str) -> int:
    """Backends of ``db`` waiting for a lock on ``audit`` (the copy job's chunks)."""
    ((n,),) = pg_server.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
        "WHERE NOT l.granted AND c.relname = 'audit' AND l.database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())", db=db)
    return int(n)


def _rename_while_span_1_copies(cdc: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any,
                                 sink_uri: str, *, fresh_full: bool, kill: bool) -> tuple[int, int]:
    """Create the changefeed with span 1's copy held inside audit's chunks (a lock on the target's audit) before it
    read fresh, then `DROP TABLE stock; ALTER TABLE fresh RENAME TO stock` (two transactions) and, with ``kill``,
    SIGKILL the capture before the lock is released. Returns the LSNs before and after the DDL."""
    def span(t: str) -> int:
        return span_of(TableName("public", t), SPANS)

    assert span("stock") == span("orders") == 0 and span("fresh") == span("audit") == 1
    tdb = sink_uri.rsplit("/", 1)[1].split("?")[0]
    pg_server.execute("CREATE TABLE audit (id int PRIMARY KEY, v text)", db=tdb)  # empty: create accepts it
    if fresh_full:
        run_sql(source, "ALTER TABLE fresh REPLICA IDENTITY FULL")
    holder = pg_server.connect(tdb)
    holder.autocommit = False
    try:
        holder.cursor().execute("LOCK TABLE audit IN SHARE MODE")  # span 1's copy waits inside audit's chunks
        cdc.create_changefeed("cpy", pg_server.uri(pg_database), sink_uri, config=CONFIG)
        # span 0 copied stock (before the DDL: its DROP comes through its stream); span 1's job waits on audit with
        # both threads, fresh not read yet
        wait_for(cdc, "cpy", lambda q: q["spans"][0]["phase"] == "streaming", "span 0's copy", timeout=120)
        run_sql(source, "UPDATE stock SET v = v || ' updated' WHERE id = 1")  # a row of stock streamed before its DROP
        deadline = time.monotonic() + 60
        while _waiting_on_lock(pg_server, tdb) < 2:
            assert time.monotonic() < deadline, f"span 1's copy did not reach audit\n{cdc.log_tail()}"
            time.sleep(0.2)
        q = cdc.changefeed("cpy")
        assert q["spans"][1]["phase"] == "snapshot", q
        before = current_lsn(source)
        run_sql(source, "DROP TABLE stock", "ALTER TABLE fresh RENAME TO stock")  # (two transactions)
        after = current_lsn(source)
        if kill:
            cdc.kill()  # span 1's job has not read fresh yet: its next run plans under a new snapshot
    finally:
        holder.rollback()
        holder.close()
    return before, after


@pytest.mark.parametrize("restart", [False, pytest.param(True, marks=pytest.mark.kills)],
                         ids=["as-planned", "restarted-keyed"])
def test_a_table_renamed_onto_another_spans_name_during_its_initial_copy_is_copied_as_planned_and_ends_equal(
    cdc_server: CdcServer, etcd_server: EtcdServer, cluster_id: str, pg_server: PostgresServer, pg_database: str,
    source: Any, sink_uri: str, restart: bool
) -> None:
    """``as-planned``: the job reads ``fresh`` by oid under its planned snapshot. ``restarted-keyed``: ``fresh`` has
    REPLICA IDENTITY FULL (its replay sends every value, so a keyed table may be copied under two snapshots) and the
    capture is SIGKILLed after the DDL, before the job read ``fresh``: the next run finds the table under its new name
    by its plan's oid and goes on under the planned name and plan (processor/snapshot.py ``_keep_renamed``), reading
    its chunks under its own snapshot into the downstream ``fresh``; the floor stays the plan's Ts, so the stream
    replays the rename over them. Without that the run copies ``stock`` after the DDL and is refused (next test)."""
    cdc = cdc_server
    tdb = sink_uri.rsplit("/", 1)[1].split("?")[0]
    before, after = _rename_while_span_1_copies(cdc, pg_server, pg_database, source, sink_uri, fresh_full=restart,
                                                kill=restart)
    if restart:
        time.sleep(1.0)
        cdc.start()

    # span 1's job reads fresh by its relation oid, as of the snapshot its copy was planned under (before the DDL),
    # into the downstream fresh; span 1 then streams the rename, which waits at the changefeed barrier until span 0
    # has applied its DROP TABLE stock. Nothing is refused, nothing skipped
    def settled(q: dict[str, Any]) -> bool:
        err = (q.get("error") or {}).get("code", "")
        assert q["state"] != "failed" and "SnapshotTable" not in err, (q["state"], q.get("error"), cdc.log_tail())
        return q["state"] == "normal" and q["checkpoint_ts"] >= after and all(
            s["phase"] == "streaming" for s in q["spans"])
    wait_for(cdc, "cpy", settled, "both spans past the DDL", timeout=180)
    state, progress, client = _span_state(etcd_server, cluster_id, "cpy", 1)
    try:
        plan = progress.get_plan("cpy", 1, TableName("public", "fresh"))
        renamed = progress.get_plan("cpy", 1, TableName("public", "stock"))
    finally:
        client.close()
    # copied once, under its old name and the first export (before the DDL): not planned again under a later one
    assert plan is not None and renamed is None, (plan, renamed)
    assert plan.ts == state.exports[0][1] < before and len(state.exports) == (2 if restart else 1), (plan, state)
    assert state.floors["public.fresh"] == plan.ts and state.oids["public.fresh"] == plan.oid, state
    run_sql(source, "INSERT INTO stock VALUES (200, 'after the rename')", "UPDATE orders SET v = 'x' WHERE id = 1")
    assert_converged(cdc, "cpy", source, sink_uri, tables=TABLES)
    ((copied,),) = pg_server.execute("SELECT count(*) FROM public.stock WHERE id BETWEEN 101 AND 130", db=tdb)
    assert copied == 30
    ((fresh,),) = pg_server.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'fresh'", db=tdb)
    assert fresh == 0  # the renamed-away name is gone downstream (the stream renamed it)
    q = cdc.changefeed("cpy")
    assert q["state"] == "normal" and not q["warnings"], q


@pytest.mark.kills
def test_a_copy_restarted_after_the_rename_runs_ahead_of_the_barrier_is_refused_and_the_named_fix_ends_equal(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    """The same DDL, and then the capture is SIGKILLed before span 1's copy read ``fresh``: the restarted run cannot
    import its old snapshot again (docs/ddl.md, "Still refused loudly"), finds the table under its new name ``stock``
    and copies it at a snapshot after the DDL. Span 0, at the changefeed barrier of its ``DROP TABLE stock``, refuses
    with ``CDC:ErrSnapshotTableChanged`` naming the span, the table and the Ts; the fix it names (skip the DDL,
    resume, resync ``public.stock``) ends with a row-by-row compare that is equal. (Once failed, the owner moves the
    table now named ``stock`` to the span its name hashes to, span 0, whose restarted stream may then meet the rename
    too, at its own Ts, with the same refusal: the fix is followed again for it; one or two rounds.) Without the
    guard this ends ``normal`` with ``stock`` empty downstream."""
    cdc = cdc_server
    tdb = sink_uri.rsplit("/", 1)[1].split("?")[0]
    before, after = _rename_while_span_1_copies(cdc, pg_server, pg_database, source, sink_uri, fresh_full=False,
                                                kill=True)
    time.sleep(1.0)
    cdc.start()

    # span 1's next run copies stock (once fresh) as of a Ts after the DDL; span 0 must not apply its DROP on it
    def settled(q: dict[str, Any]) -> bool:
        if q["state"] == "normal" and q["checkpoint_ts"] >= after:  # past the DDL: the drop was applied
            diffs = [d for d in compare_tables(source, ["public.stock"], sink_uri) if not d.equal]
            raise AssertionError(f"the changefeed went normal past the DDL: downstream stock {diffs}")
        return q["state"] == "failed"
    q = wait_for(cdc, "cpy", settled, "state failed", timeout=120)
    err = q["error"]
    assert err["code"] == "CDC:ErrSnapshotTableChanged", err
    msg = err["message"]
    m = re.search(r"--skip-ddl-ts (\d+)", msg)
    assert m is not None, msg
    ts = int(m.group(1))
    assert before < ts <= after, (before, ts, after, msg)
    assert "span cpy/1 copied table public.stock as of Ts" in msg and "DROP TABLE stock" in msg, msg
    assert "cdc cli changefeed snapshot --table" in msg, msg
    # the drop was not applied: downstream stock holds what span 1 copied (with span 0's old rows: resynced below)
    ((copied,),) = pg_server.execute("SELECT count(*) FROM public.stock WHERE id > 100", db=tdb)
    assert copied == 30

    # the fix the error names: skip that DDL, resume. The owner moves the table now named stock to the span its name
    # hashes to (span 0), whose stream then meets the rename at its own Ts with the same refusal: skipped the same way
    skipped = [ts]
    for _ in range(2):
        _cli(cdc, "changefeed", "update", "-c", "cpy", "--skip-ddl-ts", str(skipped[-1]))
        _cli(cdc, "changefeed", "resume", "-c", "cpy")
        q = wait_for(cdc, "cpy", lambda q: q["state"] == "failed" or (
            q["state"] == "normal" and q["checkpoint_ts"] >= after), "the DDL skipped", timeout=120)
        if q["state"] == "normal":
            break
        err = q["error"]
        assert err["code"] == "CDC:ErrSnapshotTableChanged" and "public.stock" in err["message"], err
        m = re.search(r"--skip-ddl-ts (\d+)", err["message"])
        assert m is not None and int(m.group(1)) not in skipped and before < int(m.group(1)) <= after, err
        skipped.append(int(m.group(1)))
    assert q["state"] == "normal", (skipped, q)
    q = _cli(cdc, "changefeed", "snapshot", "-c", "cpy", "--table", "public.stock")
    assert [c["table"] for c in q["table_copies"]] == ["public.stock"], q
    wait_for(cdc, "cpy", lambda q: not q["table_copies"] and all(
        (s["table_copy"] or {}).get("phase", "done") == "done" for s in q["spans"]), "the resync of public.stock",
        timeout=120)
    run_sql(source, "INSERT INTO stock VALUES (200, 'after the resync')", "UPDATE orders SET v = 'x' WHERE id = 1")
    assert_converged(cdc, "cpy", source, sink_uri, tables=TABLES)
    ((fresh,),) = pg_server.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'fresh'", db=tdb)
    assert fresh == 0  # the renamed-away name is gone downstream
    q = cdc.changefeed("cpy")
    assert q["state"] == "normal" and {w["code"] for w in q["warnings"]} <= {"CDC:NoticeDdlSkipped"}, q


def _span_state(etcd: EtcdServer, cluster_id: str, cf: str, span: int) -> tuple[SpanSnapshot, SnapshotProgressStore,
                                                                                 Any]:
    """Span ``span``'s stored copy state and a progress store on a client of its own (the caller closes it)."""
    client = EtcdClient([etcd.url])
    status = MetaStore(client, cluster_id).get_span_status(cf, span)
    assert status is not None and status.value.snapshot is not None, status
    return status.value.snapshot, SnapshotProgressStore(client, cluster_id), client
