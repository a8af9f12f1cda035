"""End to end through the real `cdc` command line: `python -m cli cli ...` subprocesses against a real
`cdc server` (real etcd, real PostgreSQL slots), asserting on exit codes and the JSON they print.

The happy path walks a changefeed through create / list / query / pause / resume / remove and checks
that the filter's included table was replicated while the excluded one never reached the sink. The
refusals check that every bad create exits 1 with a specific error code and a message naming the
problem, and that a refused create leaves nothing behind: no changefeed, no slot, no publication.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from capture.changefeeds import ID_RE
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.servers import EtcdServer, PostgresServer, free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

FILTER_TOML = "[filter]\nrules = ['public.*', '!public.tmp_*']\n"

HAPPY_SCHEMA = """
CREATE TABLE orders (id int PRIMARY KEY, item text NOT NULL, qty int, price numeric(10,2));
CREATE TABLE tmp_scratch (id int PRIMARY KEY, junk text);
"""

# Tables for the refusals: one fine table, one with no key at all, two tables that land on one
# target name in a sink without schemas.
REFUSAL_SCHEMA = """
CREATE TABLE public.good (id int PRIMARY KEY, v text);
CREATE TABLE public.nokey (a int, b text);
CREATE TABLE public.fullrow (a int, b text);
ALTER TABLE public.fullrow REPLICA IDENTITY FULL;
CREATE SCHEMA a;
CREATE SCHEMA b;
CREATE TABLE a.t (id int PRIMARY KEY, v text);
CREATE TABLE b.t (id int PRIMARY KEY, v text);
"""


@dataclass
class CliResult:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str

    @property
    def out(self) -> Any:
        return json.loads(self.stdout)

    @property
    def err(self) -> dict[str, Any]:
        return json.loads(self.stderr)

    def __str__(self) -> str:
        return f"{' '.join(self.argv[2:])}\n-> rc={self.rc}\nstdout: {self.stdout}\nstderr: {self.stderr}"


def cdc_cli(server_url: str, *args: str, timeout: float = 120.0) -> CliResult:
    """Run `cdc cli --server URL ARGS...` as a subprocess."""
    argv = [sys.executable, "-m", "cli", "cli", "--server", server_url, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return CliResult(argv, proc.returncode, proc.stdout, proc.stderr)


def ok(res: CliResult) -> Any:
    assert res.rc == 0, str(res)
    return res.out


def refused(res: CliResult, code: str, *fragments: str, rc: int = 1) -> str:
    """Assert a refusal: exit code, nothing on stdout, one JSON error on stderr with ``code`` and
    every fragment in its message. Returns the message."""
    assert res.rc == rc, str(res)
    assert res.stdout.strip() == "", str(res)
    err = res.err
    assert set(err) == {"error_code", "error_msg"}, str(res)
    assert err["error_code"] == code, str(res)
    for fragment in fragments:
        assert fragment in err["error_msg"], f"{fragment!r} not in the message:\n{res}"
    return str(err["error_msg"])


def tidewater_slots(pg: PostgresServer, db: str) -> list[str]:
    rows = pg.execute(
        "SELECT slot_name FROM pg_replication_slots WHERE database = %s AND slot_name LIKE 'tidewater\\_slot\\_%%' "
        "ORDER BY 1",
        params=(db,),
    )
    return [r[0] for r in rows or []]


def tidewater_publications(pg: PostgresServer, db: str) -> list[str]:
    rows = pg.execute("SELECT pubname FROM pg_publication WHERE pubname LIKE 'tidewater\\_%%' ORDER BY 1", db=db)
    return [r[0] for r in rows or []]


def published_tables(pg: PostgresServer, db: str, pub: str) -> list[str]:
    rows = pg.execute(
        "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1",
        db=db,
        params=(pub,),
    )
    return [r[0] for r in rows or []]


def wait_caught_up(server_url: str, cf: str, conn: Any, timeout: float = 90.0) -> dict[str, Any]:
    """Poll `changefeed query` until the checkpoint passes the upstream's current WAL position."""
    target = current_lsn(conn)
    deadline = time.monotonic() + timeout
    info: dict[str, Any] = {}
    while time.monotonic() < deadline:
        info = ok(cdc_cli(server_url, "changefeed", "query", "-c", cf))
        if info["checkpoint_ts"] >= target:
            return info
        time.sleep(0.3)
    raise AssertionError(f"changefeed {cf} did not reach {target:X} within {timeout}s: {info}")


def write_orders(conn: Any, start: int, n: int) -> None:
    with conn.cursor() as cur:
        for i in range(start, start + n):
            cur.execute("INSERT INTO orders VALUES (%s, %s, %s, %s)", (i, f"item {i}", i % 7, i * 1.25))
            cur.execute("INSERT INTO tmp_scratch VALUES (%s, %s)", (i, f"junk {i}"))
        cur.execute("UPDATE orders SET qty = qty + 100 WHERE id %% 3 = 0 AND id >= %s", (start,))
        cur.execute("DELETE FROM orders WHERE id = %s", (start + 1,))


def sqlite_tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


# ---- happy path -----------------------------------------------------------------------------------


def test_changefeed_lifecycle_through_the_cli(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    url = cdc_server.url
    pg_server.execute(HAPPY_SCHEMA, db=pg_database)
    conn = pg_server.connect(pg_database)
    target = tmp_path / "target.db"
    sink = f"sqlite:///{target}"
    upstream = pg_server.uri(pg_database)
    cf_toml = tmp_path / "cf.toml"
    cf_toml.write_text(FILTER_TOML)
    try:
        # create
        created = ok(cdc_cli(url, "changefeed", "create", "--changefeed-id", "orders-feed", "--upstream", upstream,
                             "--sink-uri", sink, "--config", str(cf_toml), "--snapshot", "none"))
        assert created["id"] == "orders-feed"
        assert created["state"] == "normal"
        assert created["config"]["filter"]["rules"] == ["public.*", "!public.tmp_*"]
        assert len(created["spans"]) == 1
        slot, pub = created["spans"][0]["slot"], created["spans"][0]["publication"]
        assert tidewater_slots(pg_server, pg_database) == [slot]
        assert published_tables(pg_server, pg_database, pub) == ["public.orders"]

        write_orders(conn, 0, 30)
        caught_up = wait_caught_up(url, "orders-feed", conn)
        assert caught_up["state"] == "normal" and caught_up["error"] is None

        # list and query
        listed = ok(cdc_cli(url, "changefeed", "list"))
        assert [(c["id"], c["state"]) for c in listed] == [("orders-feed", "normal")]
        queried = ok(cdc_cli(url, "changefeed", "query", "-c", "orders-feed"))
        assert queried["id"] == "orders-feed" and queried["sink_uri"] == sink
        assert queried["spans"][0]["slot"] == slot and queried["spans"][0]["capture"] is not None

        # a second create with the same id is refused and changes nothing
        msg = refused(
            cdc_cli(url, "changefeed", "create", "-c", "orders-feed", "--upstream", upstream,
                    "--sink-uri", f"sqlite:///{tmp_path / 'other.db'}"),
            "CDC:ErrChangefeedAlreadyExists", "orders-feed")
        assert "exists" in msg
        assert ok(cdc_cli(url, "changefeed", "query", "-c", "orders-feed"))["sink_uri"] == sink
        assert tidewater_slots(pg_server, pg_database) == [slot]

        # an id differing only in case maps to the same slot name: refused, and the running changefeed's
        # slot and publication must survive the cleanup of the refused create
        refused(
            cdc_cli(url, "changefeed", "create", "-c", "Orders-Feed", "--upstream", upstream,
                    "--sink-uri", f"sqlite:///{tmp_path / 'other.db'}", "--config", str(cf_toml)),
            "CDC:ErrInvalidArgument", slot, "already exists")
        assert tidewater_slots(pg_server, pg_database) == [slot]
        assert published_tables(pg_server, pg_database, pub) == ["public.orders"]
        assert [c["id"] for c in ok(cdc_cli(url, "changefeed", "list"))] == ["orders-feed"]

        # pause: state stopped, nothing moves; resume: normal again and it catches up
        paused = ok(cdc_cli(url, "changefeed", "pause", "-c", "orders-feed"))
        assert paused["state"] == "stopped"
        assert ok(cdc_cli(url, "changefeed", "query", "-c", "orders-feed"))["state"] == "stopped"
        write_orders(conn, 100, 20)
        resumed = ok(cdc_cli(url, "changefeed", "resume", "-c", "orders-feed"))
        assert resumed["state"] == "normal"
        write_orders(conn, 200, 10)
        caught_up = wait_caught_up(url, "orders-feed", conn)
        assert caught_up["state"] == "normal" and caught_up["error"] is None

        # replication happened for the included table, never for the excluded one
        (diff,) = compare_tables(conn, ["public.orders"], sink)
        assert diff.equal and diff.source_rows == 57, diff
        assert "tmp_scratch" not in sqlite_tables(target)
        assert pg_server.execute("SELECT count(*) FROM tmp_scratch", db=pg_database)[0][0] == 60

        # capture list: this one server, and it is the owner
        captures = ok(cdc_cli(url, "capture", "list"))
        assert len(captures) == 1, captures
        assert captures[0]["is_owner"] is True
        assert captures[0]["address"].endswith(f":{cdc_server.port}")

        # remove: gone from etcd and from the upstream
        removed = ok(cdc_cli(url, "changefeed", "remove", "-c", "orders-feed"))
        assert removed == {"id": "orders-feed", "removed": True}
        refused(cdc_cli(url, "changefeed", "query", "-c", "orders-feed"), "CDC:ErrChangefeedNotFound",
                "orders-feed")
        assert ok(cdc_cli(url, "changefeed", "list")) == []
        assert tidewater_slots(pg_server, pg_database) == []
        assert tidewater_publications(pg_server, pg_database) == []
        # the state commands refuse an unknown changefeed too
        for op in ("pause", "resume", "remove"):
            refused(cdc_cli(url, "changefeed", op, "-c", "orders-feed"), "CDC:ErrChangefeedNotFound", "orders-feed")
    finally:
        conn.close()


# ---- refusals -------------------------------------------------------------------------------------


@dataclass
class RefusalEnv:
    server: CdcServer
    pg: PostgresServer
    db: str
    upstream: str
    sink: str
    dir: Path


@pytest.fixture(scope="module")
def refusal_env(
    etcd_server: EtcdServer, pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RefusalEnv]:
    """One `cdc server` and one upstream database shared by the refusal tests: nothing may be created."""
    base = tmp_path_factory.mktemp("cli-refusals")
    db = f"refusals_{uuid.uuid4().hex[:8]}"
    pg_server.start()
    pg_server.create_database(db)
    pg_server.execute(REFUSAL_SCHEMA, db=db)
    server = CdcServer(etcd_server.url, base / "cdc", cluster_id=f"cli-{uuid.uuid4().hex[:8]}").start()
    try:
        yield RefusalEnv(server, pg_server, db, pg_server.uri(db), f"sqlite:///{base / 'target.db'}", base)
    finally:
        server.terminate()
        if pg_server.running:
            pg_server.drop_database(db)


def create_args(env: RefusalEnv, cf: str, *, upstream: str | None = None, sink: str | None = None,
                config: str | None = None) -> list[str]:
    args = ["changefeed", "create", "-c", cf, "--upstream", upstream or env.upstream, "--sink-uri", sink or env.sink]
    if config is not None:
        path = env.dir / f"{uuid.uuid4().hex[:8]}.toml"
        path.write_text(config)
        args += ["--config", str(path)]
    return args


def assert_nothing_left(env: RefusalEnv, cf: str) -> None:
    listed = ok(cdc_cli(env.server.url, "changefeed", "list"))
    assert cf not in [c["id"] for c in listed], listed
    assert listed == [], listed  # no create in this module may succeed
    # an id that cannot exist is refused as such (400), a valid one is not found (404)
    refused(cdc_cli(env.server.url, "changefeed", "query", "-c", cf),
            "CDC:ErrChangefeedNotFound" if ID_RE.fullmatch(cf) and len(cf) <= 64 else "CDC:ErrInvalidArgument")
    assert tidewater_slots(env.pg, env.db) == []
    assert tidewater_publications(env.pg, env.db) == []


CLOSED_PORT = free_port()  # handed out once and never bound: nothing listens there

# id, create overrides, expected error code, fragments of the message
REFUSALS: list[tuple[str, str, dict[str, str], str, tuple[str, ...]]] = [
    ("malformed-upstream", "bad-upstream", {"upstream": "postgresql//x"}, "CDC:ErrInvalidURI",
     ("postgresql//x", "malformed")),
    ("upstream-without-db", "no-db", {"upstream": "postgresql://postgres@127.0.0.1:5432"}, "CDC:ErrInvalidURI",
     ("names no database",)),
    ("unsupported-sink-scheme", "bad-sink", {"sink": "redis://127.0.0.1:6379/0"}, "CDC:ErrInvalidURI",
     ("'redis'", "not supported", "mysql")),
    ("mysql-sink-without-database", "no-sink-db", {"sink": "mysql://root@127.0.0.1:3306"}, "CDC:ErrInvalidURI",
     ("names no database", "mysql://user@host:port/dbname")),
    ("unreachable-upstream", "unreachable", {"upstream": f"postgresql://postgres@127.0.0.1:{CLOSED_PORT}/db"},
     "CDC:ErrUpstreamUnavailable", (f"127.0.0.1:{CLOSED_PORT}",)),
    ("table-without-key", "no-key", {"config": "[filter]\nrules = ['public.*']\n"}, "CDC:ErrTableIneligible",
     ('"public"."nokey"', 'ALTER TABLE "public"."nokey" ADD PRIMARY KEY',
      'ALTER TABLE "public"."nokey" REPLICA IDENTITY FULL')),
    ("at-least-once-with-a-keyless-table", "alo",
     {"config": "[filter]\nrules = ['public.good', 'public.fullrow']\n[sink]\ndelivery = \"at-least-once\"\n"},
     "CDC:ErrInvalidArgument", ("at-least-once", "public.fullrow", "exactly-once")),
    ("target-name-conflict", "conflict", {"config": "[filter]\nrules = ['a.*', 'b.*']\n"},
     "CDC:ErrTargetTableConflict", ("a.t", "b.t", "'t'")),
    ("filter-matches-nothing", "nothing", {"config": "[filter]\nrules = ['nosuchschema.*']\n"},
     "CDC:ErrInvalidArgument", ("nosuchschema.*", "matches no table")),
    ("invalid-id", "bad_id!", {}, "CDC:ErrInvalidArgument", ("invalid changefeed id", "bad_id!")),
    ("id-too-long", "x" * 65, {}, "CDC:ErrInvalidArgument", ("invalid changefeed id", "at most 64")),
    ("invalid-toml", "bad-toml", {"config": "[filter\nrules = ["}, "CDC:ErrInvalidConfig", ("not valid TOML",)),
    ("unknown-config-key", "bad-key", {"config": "span-cont = 2\n"}, "CDC:ErrInvalidConfig",
     ("unknown key 'span-cont'",)),
    ("unknown-filter-key", "bad-filter-key", {"config": "[filter]\nrule = ['public.*']\n"},
     "CDC:ErrInvalidConfig", ("unknown key 'rule'", "[filter]")),
    ("config-out-of-range", "zero-spans", {"config": "span-count = 0\n"}, "CDC:ErrInvalidConfig", ("span-count",)),
    ("config-wrong-type", "typed", {"config": "span-count = 'two'\n"}, "CDC:ErrInvalidConfig",
     ("span-count", "integer")),
    ("filter-rules-not-a-list", "rules-str", {"config": "[filter]\nrules = 'public.*'\n"}, "CDC:ErrInvalidConfig",
     ("rules", "array of strings")),
]


@pytest.mark.parametrize(("cf", "overrides", "code", "fragments"), [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_create_refused(refusal_env: RefusalEnv, cf: str, overrides: dict[str, str], code: str,
                        fragments: tuple[str, ...]) -> None:
    res = cdc_cli(refusal_env.server.url, *create_args(refusal_env, cf, **overrides))
    refused(res, code, *fragments)
    assert_nothing_left(refusal_env, cf)


def test_create_refused_table_without_key_names_only_that_table(refusal_env: RefusalEnv) -> None:
    msg = refused(cdc_cli(refusal_env.server.url, *create_args(refusal_env, "no-key-2",
                                                               config="[filter]\nrules = ['public.*']\n")),
                  "CDC:ErrTableIneligible", "nokey")
    assert '"good"' not in msg, msg
    assert_nothing_left(refusal_env, "no-key-2")


def test_create_refused_when_wal_level_is_not_logical(refusal_env: RefusalEnv, tmp_path: Path) -> None:
    replica = PostgresServer(tmp_path / "pgr", settings={"wal_level": "replica"}).start()
    try:
        replica.create_database("shop")
        replica.execute("CREATE TABLE items (id int PRIMARY KEY, v text)", db="shop")
        res = cdc_cli(refusal_env.server.url, *create_args(refusal_env, "replica-level", upstream=replica.uri("shop")))
        refused(res, "CDC:ErrUpstreamNotReady", "wal_level is 'replica'", "wal_level = logical",
                f"127.0.0.1:{replica.port}")
        assert replica.execute("SELECT count(*) FROM pg_replication_slots")[0][0] == 0
        assert replica.execute("SELECT count(*) FROM pg_publication", db="shop")[0][0] == 0
        assert_nothing_left(refusal_env, "replica-level")
    finally:
        replica.stop()


def test_create_refused_when_the_spark_master_is_not_one(refusal_env: RefusalEnv) -> None:
    """The initial copy could not run: refused up front, exit code 1, one JSON error naming the option and the fix,
    no traceback, nothing created."""
    env = refusal_env
    config = "[filter]\nrules = ['public.good']\n[snapshot]\nspark-master = \"{}\"\n"
    res = cdc_cli(env.server.url, *create_args(env, "mesos-master", config=config.format("mesos://127.0.0.1:5050")))
    refused(res, "CDC:ErrInvalidConfig", "snapshot.spark-master", "mesos://127.0.0.1:5050", "spark://host:port")
    res = cdc_cli(env.server.url, *create_args(env, "no-master", config=config.format(f"spark://127.0.0.1:{CLOSED_PORT}")))
    refused(res, "CDC:ErrSparkUnavailable", f"127.0.0.1:{CLOSED_PORT} of snapshot.spark-master does not answer",
            "start the master")
    api_port = int(env.server.url.rsplit(":", 1)[1])
    for cf, port in (("pg-master", env.pg.port), ("api-master", api_port)):  # a TCP port where something else listens
        res = cdc_cli(env.server.url, *create_args(env, cf, config=config.format(f"spark://127.0.0.1:{port}")))
        refused(res, "CDC:ErrSparkUnavailable", f"127.0.0.1:{port} of snapshot.spark-master is not a Spark master",
                "port is 7077 by default")
        assert "Traceback" not in res.stderr
    for cf in ("mesos-master", "no-master", "pg-master", "api-master"):
        assert_nothing_left(env, cf)


def test_missing_config_file_is_refused(refusal_env: RefusalEnv) -> None:
    args = ["changefeed", "create", "-c", "no-file", "--upstream", refusal_env.upstream,
            "--sink-uri", refusal_env.sink, "--config", str(refusal_env.dir / "does-not-exist.toml")]
    refused(cdc_cli(refusal_env.server.url, *args), "CDC:ErrInvalidConfig", "does-not-exist.toml")
    assert_nothing_left(refusal_env, "no-file")


def test_unreachable_cdc_server_exits_3(refusal_env: RefusalEnv) -> None:
    port = free_port()
    server = f"http://127.0.0.1:{port}"
    for args in (["changefeed", "list"], ["capture", "list"], create_args(refusal_env, "never")):
        refused(cdc_cli(server, *args), "CDC:ErrServerUnreachable", f"127.0.0.1:{port}", rc=3)
    assert_nothing_left(refusal_env, "never")


def test_bad_usage_exits_2(refusal_env: RefusalEnv) -> None:
    res = cdc_cli(refusal_env.server.url, "changefeed", "query")  # -c missing
    assert res.rc == 2 and "changefeed-id" in res.stderr, str(res)
    res = cdc_cli(refusal_env.server.url, "changefeed", "frobnicate")
    assert res.rc == 2, str(res)
