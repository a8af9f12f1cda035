"""End to end through the HTTP API `/api/v2` and the `cdc cli` commands built on it, against real
`cdc server` processes, etcd and PostgreSQL.

* every route once, with its status code and body, and the OpenAPI document listing exactly the
  routes the server serves;
* `update`: refused while running; while stopped it changes the sink, the filter (a newly included
  table enters the span publication it hashes to) and credentials, prints the diff with passwords
  redacted, and the resumed changefeed writes into the new sink;
* two captures: processors list/query, owner resign forwarded by a non-owner, drain (the flag shows in
  `capture list`, the owner moves the spans away);
* owner resign on a single capture: it resigns and wins the election again;
* `--output table` for list and query.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from e2e_workload import server_config

from capture.api import ApiServer
from capture.changefeeds import ChangefeedService
from capture.openapi import documented_routes
from cdc.events import TableName
from cdc.spans import span_of
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

SCHEMA = """
CREATE TABLE alpha (id int PRIMARY KEY, v text);
CREATE TABLE beta (id int PRIMARY KEY, v text);
CREATE TABLE gamma (id int PRIMARY KEY, v text);
CREATE TABLE delta (id int PRIMARY KEY, v text);
"""


# ---- helpers --------------------------------------------------------------------------------------
@dataclass
class Answer:
    status: int
    body: Any


def call(url: str, method: str, path: str, body: Any = None, raw: bytes | None = None,
         timeout: float = 120.0) -> Answer:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Answer(resp.status, json.loads(resp.read() or b"null"))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, json.loads(exc.read() or b"null"))


def error(answer: Answer, status: int, code: str, *fragments: str) -> str:
    assert answer.status == status, answer
    assert set(answer.body) == {"error_code", "error_msg"}, answer
    assert answer.body["error_code"] == code, answer
    for fragment in fragments:
        assert fragment in answer.body["error_msg"], (fragment, answer)
    return str(answer.body["error_msg"])


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def out(self) -> Any:
        return json.loads(self.stdout)


def cdc_cli(url: str, *args: str) -> CliResult:
    proc = subprocess.run([sys.executable, "-m", "cli", "cli", "--server", url, *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def ok(res: CliResult) -> Any:
    assert res.rc == 0, res
    return res.out


def refused(res: CliResult, code: str, *fragments: str) -> str:
    assert res.rc == 1 and res.stdout == "", res
    err = json.loads(res.stderr)
    assert err["error_code"] == code, res
    for fragment in fragments:
        assert fragment in err["error_msg"], (fragment, res)
    return str(err["error_msg"])


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last}")


def published(pg: PostgresServer, db: str, pub: str) -> list[str]:
    rows = pg.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s "
                      "ORDER BY 1", db=db, params=(pub,))
    return [r[0] for r in rows or []]


def insert(conn: Any, table: str, ids: range) -> None:
    with conn.cursor() as cur:
        for i in ids:
            cur.execute(f"INSERT INTO {table} VALUES (%s, %s)", (i, f"{table} {i}"))


def sqlite_ids(path: Path, table: str) -> set[int]:
    with sqlite3.connect(path) as db:
        try:
            return {r[0] for r in db.execute(f"SELECT id FROM {table}")}
        except sqlite3.OperationalError:  # no such table
            return set()


def table_lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def served_routes() -> set[tuple[str, str]]:
    """(METHOD, template) of every route an ApiServer serves (built on a throwaway port)."""
    api = ApiServer("127.0.0.1:0", cast(ChangefeedService, None), dict, None, bytes, lambda: True)
    try:
        return {(r.method, r.template) for r in api.routes}
    finally:
        api.httpd.server_close()


# ---- every route ----------------------------------------------------------------------------------
def test_every_route_once(cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str,
                          tmp_path: Path) -> None:
    url = cdc_server.url
    seen: set[tuple[str, str]] = set()

    def route(method: str, template: str, path: str, body: Any = None, raw: bytes | None = None) -> Answer:
        seen.add((method, template))
        return call(url, method, path, body, raw)

    pg_server.execute(SCHEMA, db=pg_database)
    upstream = pg_server.uri(pg_database)
    sink = f"sqlite:///{tmp_path / 'target.db'}"

    a = route("GET", "/api/v2/health", "/api/v2/health")
    assert (a.status, a.body) == (200, {"status": "ok"})
    status = route("GET", "/api/v2/status", "/api/v2/status")
    assert status.status == 200 and status.body["is_owner"] is True
    me = status.body["id"]

    doc = route("GET", "/api/v2/openapi.json", "/api/v2/openapi.json")
    assert doc.status == 200 and doc.body["openapi"].startswith("3.")
    documented = {(m.upper(), p) for p, item in doc.body["paths"].items() for m in item if m != "parameters"}
    assert documented == served_routes() == documented_routes()
    assert set(doc.body["components"]["schemas"]["Error"]["required"]) == {"error_code", "error_msg"}
    for (method, path) in documented:
        op = doc.body["paths"][path][method.lower()]
        if method in ("PUT",) or (method == "POST" and path == "/api/v2/changefeeds"):
            assert op["requestBody"]["required"] is True, (method, path)
        assert any(code.startswith("2") for code in op["responses"]), (method, path)

    # create: 201; refusals 400 / 409
    a = route("POST", "/api/v2/changefeeds", "/api/v2/changefeeds", {
        "changefeed_id": "routes", "upstream_uri": upstream, "sink_uri": sink,
        "config": "span-count = 2\n[filter]\nrules = ['public.alpha', 'public.beta']\n",
        "snapshot": "none"})  # (target-ts is refused while a changefeed copies; tests/e2e/test_snapshot.py)
    assert a.status == 201, a
    assert a.body["id"] == "routes" and a.body["state"] == "normal" and len(a.body["spans"]) == 2
    error(call(url, "POST", "/api/v2/changefeeds", raw=b"{not json"), 400, "CDC:ErrInvalidArgument", "not JSON")
    error(call(url, "POST", "/api/v2/changefeeds", [1, 2]), 400, "CDC:ErrInvalidArgument", "JSON object")
    error(call(url, "POST", "/api/v2/changefeeds", {"changefeed_id": "x", "sink": sink}), 400,
          "CDC:ErrInvalidArgument", "unknown field", "sink")
    error(call(url, "POST", "/api/v2/changefeeds", {"changefeed_id": "routes", "upstream_uri": upstream,
                                                     "sink_uri": sink}), 409, "CDC:ErrChangefeedAlreadyExists")

    a = route("GET", "/api/v2/changefeeds", "/api/v2/changefeeds")
    assert a.status == 200 and a.body["total"] == 1 and [c["id"] for c in a.body["items"]] == ["routes"]
    a = route("GET", "/api/v2/changefeeds/{changefeed_id}", "/api/v2/changefeeds/routes")
    assert a.status == 200 and a.body["id"] == "routes" and a.body["sink_uri"] == sink
    error(call(url, "GET", "/api/v2/changefeeds/nope"), 404, "CDC:ErrChangefeedNotFound", "nope")

    # update: refused while running, fine once stopped
    a = route("PUT", "/api/v2/changefeeds/{changefeed_id}", "/api/v2/changefeeds/routes", {"target_ts": 0})
    error(a, 409, "CDC:ErrChangefeedStateConflict", "normal", "pause")
    a = route("POST", "/api/v2/changefeeds/{changefeed_id}/pause", "/api/v2/changefeeds/routes/pause")
    assert a.status == 200 and a.body["state"] == "stopped"
    a = call(url, "PUT", "/api/v2/changefeeds/routes", {"target_ts": 1 << 60})
    assert a.status == 200, a
    assert a.body["diff"] == {"target_ts": {"old": 0, "new": 1 << 60}}
    assert a.body["changefeed"]["target_ts"] == 1 << 60 and a.body["changefeed"]["state"] == "stopped"
    error(call(url, "PUT", "/api/v2/changefeeds/routes", {}), 400, "CDC:ErrInvalidArgument", "nothing to update")
    error(call(url, "PUT", "/api/v2/changefeeds/routes", {"span_count": 3}), 400, "CDC:ErrInvalidArgument",
          "unknown field")
    error(call(url, "PUT", "/api/v2/changefeeds/routes", {"target_ts": "soon"}), 400, "CDC:ErrInvalidArgument",
          "target_ts")
    error(call(url, "PUT", "/api/v2/changefeeds/nope", {"target_ts": 0}), 404, "CDC:ErrChangefeedNotFound")
    a = route("POST", "/api/v2/changefeeds/{changefeed_id}/resume", "/api/v2/changefeeds/routes/resume")
    assert a.status == 200 and a.body["state"] == "normal"

    # a resync of a table: 202; refusals name the table or the field
    a = route("POST", "/api/v2/changefeeds/{changefeed_id}/snapshot", "/api/v2/changefeeds/routes/snapshot",
              {"tables": ["public.alpha"]})
    assert a.status == 202 and a.body["id"] == "routes", a
    assert [c["table"] for c in a.body["table_copies"]] in (["public.alpha"], []), a.body  # ([]: taken up already)
    error(call(url, "POST", "/api/v2/changefeeds/routes/snapshot", {"tables": ["public.nope"]}), 400,
          "CDC:ErrInvalidArgument", "public.nope", "public.alpha")
    error(call(url, "POST", "/api/v2/changefeeds/routes/snapshot", {"tables": []}), 400, "CDC:ErrInvalidArgument",
          "tables")
    error(call(url, "POST", "/api/v2/changefeeds/routes/snapshot", {"table": "public.alpha"}), 400,
          "CDC:ErrInvalidArgument", "unknown field")
    error(call(url, "POST", "/api/v2/changefeeds/nope/snapshot", {"tables": ["public.alpha"]}), 404,
          "CDC:ErrChangefeedNotFound")

    # captures and drain
    a = route("GET", "/api/v2/captures", "/api/v2/captures")
    assert a.status == 200 and [(c["id"], c["is_owner"], c["draining"]) for c in a.body] == [(me, True, False)]
    a = route("POST", "/api/v2/captures/{capture_id}/drain", "/api/v2/captures/no-such-capture/drain")
    error(a, 404, "CDC:ErrCaptureNotFound", "no-such-capture")
    error(call(url, "POST", f"/api/v2/captures/{me}/drain"), 409, "CDC:ErrCaptureStateConflict", "only capture")
    assert call(url, "GET", "/api/v2/captures").body[0]["draining"] is False

    # processors: both spans on this capture once the owner assigned them
    def both_spans() -> Any:
        body = call(url, "GET", "/api/v2/processors").body
        return body if body["total"] == 1 and len(body["items"][0]["spans"]) == 2 else None

    wait_for("both spans assigned", both_spans)
    a = route("GET", "/api/v2/processors", "/api/v2/processors")
    assert a.status == 200 and a.body["total"] == 1
    (proc,) = a.body["items"]
    assert (proc["changefeed_id"], proc["capture_id"]) == ("routes", me)
    assert [s["index"] for s in proc["spans"]] == [0, 1]
    a = route("GET", "/api/v2/processors/{changefeed_id}/{capture_id}", f"/api/v2/processors/routes/{me}")
    assert a.status == 200 and a.body["capture_id"] == me and len(a.body["spans"]) == 2
    error(call(url, "GET", "/api/v2/processors/routes/someone-else"), 404, "CDC:ErrCaptureNotFound")
    error(call(url, "GET", f"/api/v2/processors/nope/{me}"), 404, "CDC:ErrChangefeedNotFound")

    # verify: a job polled to its report; a finished job cannot be stopped
    a = route("POST", "/api/v2/changefeeds/{changefeed_id}/verify", "/api/v2/changefeeds/routes/verify",
              {"tables": ["public.alpha"], "chunk_rows": 100})
    assert a.status == 202 and a.body["state"] == "running" and a.body["tables"] == ["public.alpha"], a
    run = a.body["id"]

    def verified() -> Any:
        body = call(url, "GET", f"/api/v2/changefeeds/routes/verify/{run}").body
        return body if body["state"] != "running" else None

    done = wait_for("the verify report", verified, timeout=120)
    assert done["state"] == "done" and done["report"] is not None, done.get("error")
    a = route("GET", "/api/v2/changefeeds/{changefeed_id}/verify/{run_id}", f"/api/v2/changefeeds/routes/verify/{run}")
    assert a.status == 200 and a.body["id"] == run
    a = route("DELETE", "/api/v2/changefeeds/{changefeed_id}/verify/{run_id}",
              f"/api/v2/changefeeds/routes/verify/{run}")
    error(a, 404, "CDC:ErrVerifyRunNotFound", "not running")
    error(call(url, "POST", "/api/v2/changefeeds/routes/verify", {"tables": ["public.nope"]}), 400,
          "CDC:ErrInvalidArgument", "public.nope")
    error(call(url, "POST", "/api/v2/changefeeds/routes/verify", {"chunk_rows": 0}), 400, "CDC:ErrInvalidArgument",
          "chunk_rows")
    error(call(url, "GET", "/api/v2/changefeeds/routes/verify/abc"), 404, "CDC:ErrVerifyRunNotFound")
    error(call(url, "POST", "/api/v2/changefeeds/nope/verify", {}), 404, "CDC:ErrChangefeedNotFound")

    # unknown route 404, known path with another method 405
    error(call(url, "GET", "/api/v2/nothing-here"), 404, "CDC:ErrNotFound", "/api/v2/nothing-here")
    error(call(url, "DELETE", "/api/v2/captures"), 405, "CDC:ErrMethodNotAllowed", "GET")

    # delete: 202, state removed, then gone
    a = route("DELETE", "/api/v2/changefeeds/{changefeed_id}", "/api/v2/changefeeds/routes")
    assert a.status == 202 and a.body["state"] == "removed"
    wait_for("removal", lambda: call(url, "GET", "/api/v2/changefeeds/routes").status == 404)
    error(call(url, "DELETE", "/api/v2/changefeeds/routes"), 404, "CDC:ErrChangefeedNotFound")

    # every served route was exercised above, except owner/resign (its own tests below)
    assert seen | {("POST", "/api/v2/owner/resign")} == served_routes()


# ---- update ---------------------------------------------------------------------------------------
def test_update_changes_sink_filter_and_credentials(cdc_server: CdcServer, pg_server: PostgresServer,
                                                    pg_database: str, tmp_path: Path) -> None:
    url = cdc_server.url
    pg_server.execute(SCHEMA, db=pg_database)
    conn = pg_server.connect(pg_database)
    upstream = pg_server.uri(pg_database)
    one, two = tmp_path / "one.db", tmp_path / "two.db"
    old_cfg = tmp_path / "old.toml"
    old_cfg.write_text("span-count = 2\n[filter]\nrules = ['public.alpha']\n")
    new_cfg = tmp_path / "new.toml"
    new_cfg.write_text("span-count = 2\n[filter]\nrules = ['public.alpha', 'public.gamma']\n")
    try:
        created = ok(cdc_cli(url, "changefeed", "create", "-c", "upd", "--upstream", upstream,
                             "--sink-uri", f"sqlite:///{one}", "--config", str(old_cfg)))
        pubs = [s["publication"] for s in created["spans"]]
        gamma_pub = pubs[span_of(TableName("public", "gamma"), 2)]
        alpha_pub = pubs[span_of(TableName("public", "alpha"), 2)]
        assert "public.gamma" not in published(pg_server, pg_database, gamma_pub)
        insert(conn, "alpha", range(0, 10))
        cdc_server.wait_checkpoint("upd", current_lsn(conn))
        assert sqlite_ids(one, "alpha") == set(range(10))

        # refused while running, with the way out in the message
        refused(cdc_cli(url, "changefeed", "update", "-c", "upd", "--sink-uri", f"sqlite:///{two}"),
                "CDC:ErrChangefeedStateConflict", "pause it first", "normal")
        assert ok(cdc_cli(url, "changefeed", "query", "-c", "upd"))["sink_uri"] == f"sqlite:///{one}"

        assert ok(cdc_cli(url, "changefeed", "pause", "-c", "upd"))["state"] == "stopped"

        # refusals while stopped: span-count, another database, a filter that matches nothing
        bad = tmp_path / "bad.toml"
        bad.write_text("span-count = 1\n[filter]\nrules = ['public.alpha']\n")
        refused(cdc_cli(url, "changefeed", "update", "-c", "upd", "--config", str(bad)), "CDC:ErrInvalidConfig",
                "span-count", "2")
        refused(cdc_cli(url, "changefeed", "update", "-c", "upd", "--upstream", pg_server.uri("postgres")),
                "CDC:ErrInvalidArgument", "not the server or database")
        bad.write_text("span-count = 2\n[filter]\nrules = ['nosuch.*']\n")
        refused(cdc_cli(url, "changefeed", "update", "-c", "upd", "--config", str(bad)), "CDC:ErrInvalidArgument",
                "matches no table")
        assert published(pg_server, pg_database, alpha_pub) == ["public.alpha"]

        # the update itself: new sink, new filter, new credentials (redacted in the diff)
        with_password = upstream.replace("postgres@", "postgres:s3cret@", 1)
        res = ok(cdc_cli(url, "changefeed", "update", "-c", "upd", "--sink-uri", f"sqlite:///{two}",
                         "--config", str(new_cfg), "--upstream", with_password))
        diff = res["diff"]
        assert diff["sink_uri"] == {"old": f"sqlite:///{one}", "new": f"sqlite:///{two}"}
        assert diff["config.filter.rules"] == {"old": ["public.alpha"], "new": ["public.alpha", "public.gamma"]}
        assert diff["tables"] == {"old": ["public.alpha"], "new": ["public.alpha", "public.gamma"]}
        assert diff["upstream_uri"]["new"] == upstream.replace("postgres@", "postgres:***@", 1)
        assert "s3cret" not in json.dumps(res)
        assert set(diff) == {"sink_uri", "config.filter.rules", "tables", "upstream_uri"}
        assert res["changefeed"]["state"] == "stopped"
        assert res["changefeed"]["config"]["filter"]["rules"] == ["public.alpha", "public.gamma"]
        assert "public.gamma" in published(pg_server, pg_database, gamma_pub)
        assert "public.alpha" in published(pg_server, pg_database, alpha_pub)
        insert(conn, "alpha", range(10, 15))  # while stopped: goes to the new sink on resume
        queried = ok(cdc_cli(url, "changefeed", "query", "-c", "upd"))
        assert queried["sink_uri"] == f"sqlite:///{two}" and "s3cret" not in json.dumps(queried)

        # the same update again changes nothing; --output table prints the diff as a table
        again = ok(cdc_cli(url, "changefeed", "update", "-c", "upd", "--config", str(new_cfg)))
        assert again["diff"] == {}
        table = cdc_cli(url, "--output", "table", "changefeed", "update", "-c", "upd", "--target-ts", "0",
                        "--sink-uri", f"sqlite:///{two}")
        assert table.rc == 0 and "nothing changed" in table.stdout, table
        old_filter = tmp_path / "old-filter.toml"
        old_filter.write_text("span-count = 2\n[filter]\nrules = ['public.alpha', 'public.gamma', 'public.delta']\n")
        table = cdc_cli(url, "changefeed", "update", "-c", "upd", "--config", str(old_filter), "--output", "table")
        assert table.rc == 0, table
        rows = table_lines(table.stdout)
        assert rows[0] == ["FIELD", "OLD", "NEW"]
        assert [r[0] for r in rows[1:]] == ["config.filter.rules", "tables"]
        assert rows[1][2] == '["public.alpha","public.gamma","public.delta"]'

        # resume: the new sink receives alpha after the checkpoint and the newly included gamma
        assert ok(cdc_cli(url, "changefeed", "resume", "-c", "upd"))["state"] == "normal"
        insert(conn, "gamma", range(0, 20))
        insert(conn, "alpha", range(15, 20))
        cdc_server.wait_checkpoint("upd", current_lsn(conn))
        (gamma,) = compare_tables(conn, ["public.gamma"], f"sqlite:///{two}")
        assert gamma.equal and gamma.source_rows == 20, gamma
        assert set(range(10, 20)) <= sqlite_ids(two, "alpha") <= set(range(20))
        assert sqlite_ids(one, "alpha") == set(range(10))  # the old sink got nothing after the pause
        assert sqlite_ids(one, "gamma") == set()
    finally:
        conn.close()


# ---- two captures: processors, forwarded resign, drain ----------------------------------------------
def test_processors_resign_forwarding_and_drain(cdc_server: CdcServer, etcd_server: EtcdServer,
                                                pg_server: PostgresServer, pg_database: str,
                                                tmp_path: Path) -> None:
    first = cdc_server
    second = CdcServer(etcd_server.url, tmp_path / "cdc2", cluster_id=first.cluster_id,
                       extra_args=server_config(tmp_path)).start()
    try:
        pg_server.execute(SCHEMA, db=pg_database)
        conn = pg_server.connect(pg_database)
        cfg = tmp_path / "cf.toml"
        cfg.write_text("span-count = 2\n")
        ok(cdc_cli(first.url, "changefeed", "create", "-c", "two", "--upstream", pg_server.uri(pg_database),
                   "--sink-uri", f"sqlite:///{tmp_path / 't.db'}", "--config", str(cfg), "--snapshot", "none"))
        ids = {s.get("/api/v2/status")["id"]: s for s in (first, second)}
        assert len(ids) == 2

        # one span per capture once balanced: one processor per (changefeed, capture)
        def balanced() -> Any:
            items = ok(cdc_cli(second.url, "processor", "list"))
            spans = {p["capture_id"]: [s["index"] for s in p["spans"]] for p in items}
            running = all(s["running"] for p in items for s in p["spans"])
            return items if set(spans) == set(ids) and all(len(v) == 1 for v in spans.values()) and running \
                else None

        items = wait_for("one running span on each capture", balanced, timeout=90)
        for p in items:
            assert p["changefeed_id"] == "two" and p["errors"] == [] and p["checkpoint_ts"] > 0
            q = ok(cdc_cli(first.url, "processor", "query", "-c", "two", "--capture-id", p["capture_id"]))
            assert q["capture_id"] == p["capture_id"] and q["changefeed_id"] == "two"
            assert [(s["index"], s["epoch"]) for s in q["spans"]] == [(s["index"], s["epoch"]) for s in p["spans"]]
            assert q["address"] == ids[p["capture_id"]].url.removeprefix("http://")

        # --output table: processor list / query, capture list
        table = cdc_cli(first.url, "--output", "table", "processor", "list")
        rows = table_lines(table.stdout)
        assert rows[0] == ["CHANGEFEED", "CAPTURE", "SPANS", "CHECKPOINT", "ERRORS"]
        assert sorted(r[1] for r in rows[1:]) == sorted(ids)
        some = rows[1][1]
        table = cdc_cli(first.url, "processor", "query", "-c", "two", "--capture-id", some, "-o", "table")
        head, spans = table.stdout.split("\n\n")
        assert "capture:" in head and some in head
        assert table_lines(spans)[0][:3] == ["SPAN", "EPOCH", "CHECKPOINT"]

        # resign asked of the non-owner is forwarded to the owner; the other capture takes over
        owner_id = next(c["id"] for c in first.get("/api/v2/captures") if c["is_owner"])
        other_id = next(i for i in ids if i != owner_id)
        res = ok(cdc_cli(ids[other_id].url, "owner", "resign"))
        assert res["resigned"] is True and res["previous_owner"] == owner_id, res
        assert res["owner"] == other_id and res["same_capture"] is False, res
        wait_for("the new owner in capture list",
                 lambda: {c["id"]: c["is_owner"] for c in first.get("/api/v2/captures")} ==
                 {other_id: True, owner_id: False})

        # drain the old owner: its flag shows, the owner moves its span away, replication goes on
        drained = ok(cdc_cli(first.url, "capture", "drain", "--capture-id", owner_id))
        assert drained["id"] == owner_id and drained["draining"] is True
        caps = {c["id"]: c for c in ok(cdc_cli(second.url, "capture", "list"))}
        assert caps[owner_id]["draining"] is True and caps[other_id]["draining"] is False
        table = table_lines(cdc_cli(second.url, "capture", "list", "--output", "table").stdout)
        assert table[0] == ["ID", "ADDRESS", "OWNER", "DRAINING", "SPANS", "VERSION", "PID"]
        assert {r[0]: r[3] for r in table[1:]} == {owner_id: "true", other_id: "false"}
        wait_for("both spans on the remaining capture", lambda: [
            (p["capture_id"], len(p["spans"])) for p in first.get("/api/v2/processors")["items"]
        ] == [(other_id, 2)], timeout=90)
        insert(conn, "beta", range(0, 30))
        info = first.wait_checkpoint("two", current_lsn(conn))
        assert info["state"] == "normal" and {s["capture"] for s in info["spans"]} == {other_id}, (info["error"], info["warnings"])
        (beta,) = compare_tables(conn, ["public.beta"], f"sqlite:///{tmp_path / 't.db'}")
        assert beta.equal and beta.source_rows == 30, beta
        # draining again is idempotent; the last non-draining capture cannot be drained
        assert ok(cdc_cli(second.url, "capture", "drain", "--capture-id", owner_id))["draining"] is True
        refused(cdc_cli(second.url, "capture", "drain", "--capture-id", other_id), "CDC:ErrCaptureStateConflict")
        conn.close()
    finally:
        second.terminate()


# ---- owner resign on one capture --------------------------------------------------------------------
def test_owner_resign_on_a_single_capture_wins_again(cdc_server: CdcServer) -> None:
    me = cdc_server.get("/api/v2/status")["id"]
    res = ok(cdc_cli(cdc_server.url, "owner", "resign"))
    assert res == {"resigned": True, "previous_owner": me, "owner": me, "same_capture": True,
                   "message": f"capture {me} resigned; capture {me} won the election again"}
    wait_for("owner again", lambda: cdc_server.get("/api/v2/status")["is_owner"])
    assert [(c["id"], c["is_owner"]) for c in cdc_server.get("/api/v2/captures")] == [(me, True)]


# ---- table output for changefeed list / query ------------------------------------------------------
def test_changefeed_list_and_query_as_tables(cdc_server: CdcServer, pg_server: PostgresServer,
                                             pg_database: str, tmp_path: Path) -> None:
    url = cdc_server.url
    pg_server.execute(SCHEMA, db=pg_database)
    cfg = tmp_path / "cf.toml"
    cfg.write_text("span-count = 2\n")
    created = ok(cdc_cli(url, "changefeed", "create", "-c", "tbl", "--upstream", pg_server.uri(pg_database),
                         "--sink-uri", "blackhole://", "--config", str(cfg), "--snapshot", "none"))
    res = cdc_cli(url, "--output", "table", "changefeed", "list")
    assert res.rc == 0, res
    rows = table_lines(res.stdout)
    assert rows[0] == ["ID", "STATE", "CHECKPOINT", "CHECKPOINT", "LAG", "WARNINGS", "ERROR"]
    assert rows[1][:2] == ["tbl", "normal"] and rows[1][-2:] == ["0", "-"]
    res = cdc_cli(url, "changefeed", "query", "-c", "tbl", "--output", "table")
    assert res.rc == 0, res
    head, spans = res.stdout.split("\n\n")
    kv = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in head.splitlines())}
    assert kv["id"] == "tbl" and kv["state"] == "normal" and kv["sink"] == "blackhole://"
    span_rows = table_lines(spans)
    assert span_rows[0] == ["SPAN", "CAPTURE", "SLOT", "PUBLICATION", "CHECKPOINT", "RUNNING", "ROWS", "ERROR"]
    assert [(r[0], r[2], r[3]) for r in span_rows[1:]] == [
        (str(s["index"]), s["slot"], s["publication"]) for s in created["spans"]]
    # errors stay JSON on stderr in table mode too
    refused(cdc_cli(url, "-o", "table", "changefeed", "query", "-c", "nope"), "CDC:ErrChangefeedNotFound")
    ok(cdc_cli(url, "changefeed", "remove", "-c", "tbl"))
