"""A secured cluster end to end (issue 12, items 7 and 8): two real `cdc server` processes with mutual TLS,
an API token, a secret key file and JSON logs; the CLI configured only through the environment and files.

Checks that no secret shows anywhere an operator or another user could look (process command lines,
API and CLI output, CLI errors, logs, etcd), that mutations need the token, that owner resign is forwarded
over mutual TLS with the caller's token, and that replication works with sealed credentials (rows compared).
Also: a busy --addr is one clear line and a non-zero exit; a non-loopback bind without TLS and auth warns.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import server_config

from cdc.crypto import generate_key
from cdc.meta import keys
from cdc.meta.etcd import EtcdClient
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.servers import EtcdServer, PostgresServer, free_port
from tests.tls_material import make_tls_material

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TOKEN = "e2e-token-" + "k" * 30
PASSWORD = "Pa@ss/w0rd:%?x"  # every character that used to leak
ENCODED = "Pa%40ss%2Fw0rd%3A%25%3Fx"
SSLPASSWORD = "Ssl-k3y-secret"
SECRETS = (PASSWORD, ENCODED, SSLPASSWORD, TOKEN, "Pa@ss")


def no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shown in {where}:\n{text[:3000]}"


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", "cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **env})


def ok(res: subprocess.CompletedProcess[str]) -> Any:
    assert res.returncode == 0, res
    no_secret(res.stdout + res.stderr, "CLI output")
    return json.loads(res.stdout)


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_secured_cluster(etcd_server: EtcdServer, pg_server: PostgresServer, pg_database: str, cluster_id: str,
                         tmp_path: Path) -> None:
    tls = make_tls_material(tmp_path / "tls")
    key_file = tmp_path / "secret.keys"
    key_file.write_text(f"# first key seals\n{generate_key()}\n")
    token_file = tmp_path / "api.tokens"
    token_file.write_text(TOKEN + "\n")
    security = ["--cert", str(tls.server_cert), "--key", str(tls.server_key), "--ca", str(tls.ca_cert),
                "--client-auth", "--auth-token-file", str(token_file), "--secret-key-file", str(key_file),
                "--log-format", "json", *server_config(tmp_path)]
    client_tls = ssl.create_default_context(cafile=str(tls.ca_cert))
    client_tls.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    first = CdcServer(etcd_server.url, tmp_path / "c1", cluster_id=cluster_id, extra_args=security, tls=client_tls,
                      token=TOKEN).start()
    second = CdcServer(etcd_server.url, tmp_path / "c2", cluster_id=cluster_id, extra_args=security,
                       tls=client_tls, token=TOKEN).start()
    pg_server.execute("CREATE TABLE items (id int PRIMARY KEY, v text)", db=pg_database)
    conn = pg_server.connect(pg_database)
    try:
        env = {"TIDEWATER_SERVER": second.url, "TIDEWATER_AUTH_TOKEN_FILE": str(token_file),
               "TIDEWATER_CA": str(tls.ca_cert), "TIDEWATER_CERT": str(tls.client_cert),
               "TIDEWATER_KEY": str(tls.client_key)}
        upstream = pg_server.uri(pg_database).replace("postgres@", f"postgres:{ENCODED}@", 1) + \
            f"?sslpassword={SSLPASSWORD}"
        target = tmp_path / "target.db"
        (tmp_path / "upstream.uri").write_text(upstream + "\n")
        created = ok(cli({**env, "TIDEWATER_SINK_URI": f"sqlite:///{target}"}, "changefeed", "create", "-c", "sec",
                         "--upstream-file", str(tmp_path / "upstream.uri")))
        assert created["upstream_uri"].startswith("postgresql://postgres:***@127.0.0.1")
        assert created["upstream_uri"].endswith("?sslpassword=***")

        # the sealed credentials still replicate: rows compared
        with conn.cursor() as cur:
            cur.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 50) g")
        first.wait_checkpoint("sec", current_lsn(conn))
        (items,) = compare_tables(conn, ["public.items"], f"sqlite:///{target}")
        assert items.equal and items.source_rows == 50, items

        # nothing secret on command lines, in etcd, in API/CLI answers
        for server in (first, second):
            assert server.proc is not None
            no_secret(cmdline(server.proc.pid), "the cdc server command line")
        etcd = EtcdClient([etcd_server.url])
        try:
            kv = etcd.get(keys.changefeed_info_key(cluster_id, "sec"))
            assert kv is not None and b"tidewater-enc:v1:" in kv.value
            no_secret(kv.value.decode(), "etcd")
        finally:
            etcd.close()
        no_secret(json.dumps(first.changefeed("sec")), "the API")
        scraped = []
        for server in (first, second):  # metric labels (read routes are open: no token needed)
            with urllib.request.urlopen(f"{server.url}/metrics", context=client_tls, timeout=10) as resp:
                scraped.append(resp.read().decode())
            no_secret(scraped[-1], "/metrics")
        assert any('changefeed="sec"' in text for text in scraped)
        table = cli(env, "changefeed", "query", "-c", "sec", "-o", "table")
        assert table.returncode == 0 and "postgresql://postgres:***@" in table.stdout, table
        no_secret(table.stdout, "CLI table output")

        # mutations need the token; reads are open by default
        no_token = {k: v for k, v in env.items() if k != "TIDEWATER_AUTH_TOKEN_FILE"}
        res = cli(no_token, "changefeed", "pause", "-c", "sec")
        assert res.returncode == 1 and json.loads(res.stderr)["error_code"] == "CDC:ErrUnauthorized", res
        listed = cli(no_token, "changefeed", "list")
        assert listed.returncode == 0 and [c["id"] for c in json.loads(listed.stdout)] == ["sec"], listed
        # no client certificate: refused by mutual TLS
        res = cli({k: v for k, v in env.items() if k not in ("TIDEWATER_CERT", "TIDEWATER_KEY")},
                  "changefeed", "list")
        assert res.returncode == 3, res

        # a URI error from the server does not echo the password
        bad = pg_server.uri(pg_database).replace("postgres@", f"postgres:{ENCODED}@", 1).replace(
            f":{pg_server.port}/", ":99999/")
        res = cli({**env, "TIDEWATER_UPSTREAM_URI": bad, "TIDEWATER_SINK_URI": "blackhole://"},
                  "changefeed", "create", "-c", "bad")
        assert res.returncode == 1 and json.loads(res.stderr)["error_code"] == "CDC:ErrInvalidURI", res
        no_secret(res.stderr, "a CLI error")

        # owner resign asked of the non-owner: forwarded over mutual TLS with the caller's token
        owner_id = next(c["id"] for c in first.get("/api/v2/captures") if c["is_owner"])
        other = second if second.get("/api/v2/status")["id"] != owner_id else first
        res = ok(cli({**env, "TIDEWATER_SERVER": other.url}, "owner", "resign"))
        assert res["resigned"] is True and res["previous_owner"] == owner_id, res

        # logs: JSON lines with stable fields, no secret in any of them
        ok(cli(env, "changefeed", "pause", "-c", "sec"))
        ok(cli(env, "changefeed", "resume", "-c", "sec"))
        lines = []
        for server in (first, second):
            text = server.log_file.read_text()
            no_secret(text, f"the log {server.log_file}")
            lines += [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert lines and all({"time", "level", "logger", "msg"} <= set(obj) for obj in lines)
        states = [obj for obj in lines if obj.get("changefeed") == "sec" and " state " in obj["msg"]]
        assert [o["msg"].split(": ")[0] for o in states] == [
            "changefeed=sec state normal -> stopped", "changefeed=sec state stopped -> normal"], states
        assert all(o["level"] == "info" and o.get("capture") for o in states)
        ok(cli(env, "changefeed", "remove", "-c", "sec"))
    finally:
        conn.close()
        second.terminate()
        first.terminate()


def test_busy_addr_is_one_clear_line(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "cli", "server", "--etcd", etcd_server.url, "--addr",
                               f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d"), "--cluster-id", cluster_id],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1, proc
    (line,) = proc.stderr.strip().splitlines()
    err = json.loads(line)
    assert err["error_code"] == "CDC:ErrAddressInUse" and f"127.0.0.1:{port}" in err["error_msg"], err
    assert "Address already in use" in err["error_msg"] and time.monotonic() - t0 < 30


def test_exposed_bind_warns_and_default_is_loopback(etcd_server: EtcdServer, cluster_id: str,
                                                    tmp_path: Path) -> None:
    from cdc.config import ServerConfig

    assert ServerConfig().addr.startswith("127.0.0.1:")
    port = free_port()
    tokens = tmp_path / "tokens"
    tokens.write_text("x" * 20 + "\n")
    tokens.chmod(0o644)
    server = CdcServer(etcd_server.url, tmp_path / "x", cluster_id=cluster_id, port=port,
                       extra_args=["--addr", f"0.0.0.0:{port}", "--auth-token-file", str(tokens),
                                   *server_config(tmp_path)]).start()
    try:
        log = server.log_tail(200)
        assert "reachable from other hosts, without TLS:" in log, log
        assert "credentials are stored in etcd in plain text" in log, log
        assert f"the auth token file {tokens} is readable by other users: chmod 600 it" in log, log
    finally:
        server.terminate()


def test_a_capture_without_the_key_is_loud_and_recovers(etcd_server: EtcdServer, pg_server: PostgresServer,
                                                        pg_database: str, cluster_id: str, tmp_path: Path) -> None:
    """Misconfiguration: one capture lacks the secret key file. Its span fails with a retryable
    CDC:ErrSecretKeyMissing (the changefeed shows warning, naming the fix); restarted with the key, the
    changefeed returns to normal and every row arrives."""
    key_file = tmp_path / "secret.keys"
    key_file.write_text(generate_key() + "\n")
    with_key = ["--secret-key-file", str(key_file), *server_config(tmp_path)]
    good = CdcServer(etcd_server.url, tmp_path / "good", cluster_id=cluster_id, extra_args=with_key).start()
    bad = CdcServer(etcd_server.url, tmp_path / "bad", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, name="nokey.toml")).start()
    pg_server.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY);"
                      "CREATE TABLE c (id int PRIMARY KEY); CREATE TABLE d (id int PRIMARY KEY)", db=pg_database)
    conn = pg_server.connect(pg_database)
    target = tmp_path / "t.db"
    try:
        good.create_changefeed("k", pg_server.uri(pg_database), f"sqlite:///{target}", "span-count = 2\n", snapshot="none")
        deadline = time.monotonic() + 60
        cf: dict[str, Any] = {}
        while time.monotonic() < deadline:
            cf = good.changefeed("k")
            if cf["state"] == "warning" and cf["error"] and cf["error"]["code"] == "CDC:ErrSecretKeyMissing":
                break
            time.sleep(0.3)
        assert cf["state"] == "warning" and cf["error"]["code"] == "CDC:ErrSecretKeyMissing", cf
        assert "--secret-key-file" in cf["error"]["message"]
        assert bad.changefeed("k")["sink_uri"] == "<encrypted>"  # still queryable there
        bad.terminate()
        bad = CdcServer(etcd_server.url, tmp_path / "bad", cluster_id=cluster_id, port=bad.port,
                        extra_args=with_key).start()
        with conn.cursor() as cur:
            for t in "abcd":
                cur.execute(f"INSERT INTO {t} SELECT generate_series(1, 20)")
        good.wait_checkpoint("k", current_lsn(conn), timeout=120)
        deadline = time.monotonic() + 60
        while good.changefeed("k")["state"] != "normal" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert good.changefeed("k")["state"] == "normal"
        for result in compare_tables(conn, [f"public.{t}" for t in "abcd"], f"sqlite:///{target}"):
            assert result.equal and result.source_rows == 20, result
    finally:
        conn.close()
        bad.terminate()
        good.terminate()
