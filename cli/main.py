"""The `cdc` command: `cdc server ...` runs a capture; `cdc cli ...` talks to a server's HTTP API.

Output is JSON on stdout by default; ``cdc cli --output table ...`` prints plain aligned text for humans
(lists as tables; one object as ``key: value`` lines, plus a table of its spans). Errors are always one
JSON object ``{"error_code", "error_msg"}`` on stderr and a non-zero exit code: 1 for a refused
request, 2 for bad usage, 3 when the server is unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.crypto import generate_key
from cdc.uri import SINK_URI_FORMS, scrub
from cli.args import CliError, read_secret_file, uri_arg
from cli.progress import WatchEnded, watch
from cli.render import emit
from cli.verify_progress import VerifyProgress

DEFAULT_SERVER = "http://127.0.0.1:8300"
OUTPUTS = ("json", "table")
# Client settings from the environment (so that no secret need be on the command line, where `ps` shows it)
ENV_SERVER = "TIDEWATER_SERVER"
ENV_TOKEN = "TIDEWATER_AUTH_TOKEN"
ENV_TOKEN_FILE = "TIDEWATER_AUTH_TOKEN_FILE"
ENV_CA, ENV_CERT, ENV_KEY = "TIDEWATER_CA", "TIDEWATER_CERT", "TIDEWATER_KEY"
ENV_CLIENT_CONFIG = "TIDEWATER_CLI_CONFIG"
ENV_UPSTREAM, ENV_SINK = "TIDEWATER_UPSTREAM_URI", "TIDEWATER_SINK_URI"
CLIENT_CONFIG_KEYS = ("server", "token", "token-file", "ca", "cert", "key")
KAFKA_PROTOCOLS = ("canal-json", "open-protocol", "debezium")  # the Kafka consumer decodes these


@dataclass(frozen=True)
class Client:
    """Where and how the CLI talks to a server: its URL, the API token (sent as ``Bearer``), TLS."""

    server: str
    token: str = ""
    tls: ssl.SSLContext | None = None


def _client_config(path: str) -> dict[str, Any]:
    if not path:
        return {}
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CliError("CDC:ErrInvalidConfig", f"cannot read the client config {path}: {exc}", 2) from exc
    unknown = sorted(set(raw) - set(CLIENT_CONFIG_KEYS))
    if unknown:
        raise CliError("CDC:ErrInvalidConfig", f"unknown key(s) {', '.join(unknown)} in {path} "
                       f"(known: {', '.join(CLIENT_CONFIG_KEYS)})", 2)
    return raw


def make_client(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Client:
    """Flags first, then the environment, then the client config file (``--client-config`` or
    ``$TIDEWATER_CLI_CONFIG``, TOML with ``server``, ``token-file`` or ``token``, ``ca``, ``cert``, ``key``)."""
    env = os.environ if environ is None else environ
    conf = _client_config(getattr(args, "client_config", None) or env.get(ENV_CLIENT_CONFIG, ""))
    server = getattr(args, "server", None) or env.get(ENV_SERVER) or conf.get("server") or DEFAULT_SERVER
    token_file = getattr(args, "token_file", None) or env.get(ENV_TOKEN_FILE) or conf.get("token-file") or ""
    token = read_secret_file(token_file, "API token") if token_file else \
        (env.get(ENV_TOKEN, "").split(",")[0].strip() or str(conf.get("token") or ""))
    ca = getattr(args, "ca", None) or env.get(ENV_CA) or conf.get("ca") or ""
    cert = getattr(args, "cert", None) or env.get(ENV_CERT) or conf.get("cert") or ""
    key = getattr(args, "key", None) or env.get(ENV_KEY) or conf.get("key") or ""
    tls = None
    if server.startswith("https:") or ca or cert:
        try:
            tls = ssl.create_default_context(cafile=ca or None)
            if cert:
                tls.load_cert_chain(cert, key or None)
        except (OSError, ssl.SSLError) as exc:
            raise CliError("CDC:ErrInvalidConfig", f"cannot load TLS files (ca {ca or '-'}, cert {cert or '-'}): "
                           f"{exc}", 2) from exc
    return Client(server, token, tls)


def _request(client: Client, method: str, path: str, body: Any = None, timeout: float = 120.0) -> Any:
    server = client.server
    url = server.rstrip("/") + path
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if client.token:
        headers["Authorization"] = f"Bearer {client.token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=client.tls) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            err = json.loads(exc.read())
        except (json.JSONDecodeError, ValueError):
            err = {"error_code": "CDC:ErrHTTP", "error_msg": f"HTTP {exc.code} from {url}"}
        raise CliError(err.get("error_code", "CDC:ErrHTTP"), err.get("error_msg", str(err))) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError("CDC:ErrServerUnreachable", f"cannot reach cdc server at {server}: {reason}", 3) from exc


def _seg(value: str) -> str:
    """One URL path segment (ids are validated by the server; this only keeps the path intact)."""
    return urllib.parse.quote(value, safe="")


def _read_config(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise CliError("CDC:ErrInvalidConfig", f"cannot read config file {path}: {exc}") from exc


# ---- commands: each returns (kind, result); kind selects the table layout ----------------------------
Result = tuple[str, Any]


def _cmd_changefeed(args: argparse.Namespace) -> Result:
    s = args.server
    op = args.op
    if op == "create":
        config = _read_config(args.config) if args.config else ""
        upstream = uri_arg(args, "upstream", ENV_UPSTREAM, "upstream URI", True)
        sink = uri_arg(args, "sink_uri", ENV_SINK, "sink URI", True)
        created = _request(s, "POST", "/api/v2/changefeeds", {
            "changefeed_id": args.changefeed_id, "upstream_uri": upstream, "sink_uri": sink,
            "config": config, "target_ts": args.target_ts,
            **({"snapshot": args.snapshot} if args.snapshot else {})})
        if args.wait:
            return "changefeed", _watch(s, f"/api/v2/changefeeds/{_seg(args.changefeed_id)}")
        return "changefeed", created
    if op == "list":
        return "changefeeds", _request(s, "GET", "/api/v2/changefeeds")["items"]
    path = f"/api/v2/changefeeds/{_seg(args.changefeed_id)}"
    if op == "query":
        if args.watch:
            return "changefeed", _watch(s, path)
        return "changefeed", _request(s, "GET", path)
    if op in ("pause", "resume"):
        return "changefeed", _request(s, "POST", f"{path}/{op}")
    if op == "snapshot":
        return "changefeed", _request(s, "POST", f"{path}/snapshot", {"tables": args.table})
    if op == "verify":
        run = _verify(s, path, args, args.tables)
        if args.repair and verify_exit_code(run) == VERIFY_DIFFERS:
            run = _repair(s, path, args, run)
        return "verify", run
    if op == "update":
        body: dict[str, Any] = {}
        sink = uri_arg(args, "sink_uri", "", "sink URI", False)
        if sink is not None:
            body["sink_uri"] = sink
        upstream = uri_arg(args, "upstream", "", "upstream URI", False)
        if upstream is not None:
            body["upstream_uri"] = upstream
        if args.config is not None:
            body["config"] = _read_config(args.config)
        if args.target_ts is not None:
            body["target_ts"] = args.target_ts
        if args.skip_ddl_ts is not None:
            body["skip_ddl_ts"] = args.skip_ddl_ts
        if not body:
            raise CliError("CDC:ErrUsage", "nothing to update: give --sink-uri, --config, --target-ts, --skip-ddl-ts "
                           "or --upstream", 2)
        return "update", _request(s, "PUT", path, body)
    if op == "remove":
        result = _request(s, "DELETE", path)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                _request(s, "GET", path)
            except CliError as exc:
                if exc.code == "CDC:ErrChangefeedNotFound":
                    return "object", {"id": args.changefeed_id, "removed": True}
                raise
            time.sleep(0.5)
        raise CliError("CDC:ErrTimeout", f"changefeed {args.changefeed_id} is marked removed but the owner has not "
                       f"finished dropping its slots within {args.timeout}s; state: {result.get('state')}")
    raise CliError("CDC:ErrUsage", f"unknown changefeed command {op}", 2)


VERIFY_EQUAL, VERIFY_DIFFERS, VERIFY_COULD_NOT_RUN = 0, 1, 2


def verify_exit_code(run: dict[str, Any]) -> int:
    """``changefeed verify``'s exit code: 0 every table equal, 1 some table differs, 2 it could not run."""
    report = run.get("report")
    if run.get("state") != "done" or not isinstance(report, dict) or report.get("error"):
        return VERIFY_COULD_NOT_RUN
    tables = report.get("tables") or []
    differs = any(t.get(k) for t in tables for k in ("missing", "extra", "different", "inexact", "note"))
    return VERIFY_DIFFERS if differs else VERIFY_EQUAL


def _repair(client: Client, path: str, args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    """``--repair``: resync (``changefeed snapshot``) every table that differs -- not those whose only differences
    are values no target can hold exactly, which a copy cannot change --, wait until the copies are done, verify
    those tables again; the second run is the result (its ``repaired`` lists the tables, ``before`` the first
    report). A storage sink is refused (stderr and ``repair_refused``; the exit code stays 1, the differences)."""
    tables = [t for t in run["report"]["tables"]
              if any(t.get(k) for k in ("missing", "extra", "different", "note"))]
    names = [t["table"] for t in tables]
    if not names:
        return run
    sink = str(_request(client, "GET", path).get("sink_uri") or "")
    if sink.startswith("file:"):
        reason = (f"--repair refused for {', '.join(names)}: the changefeed's sink is a storage sink (file://), whose "
                  "files are an append-only change log that a resync cannot rewrite (a copy would append the whole "
                  "table after the wrong changes). Rebuild the lake from a new changefeed's files, or remove the "
                  "verifier's lake (<sink dir>/.tidewater-verify/<changefeed>) if only the lake is wrong")
        print(reason, file=sys.stderr)
        return {**run, "repair_refused": reason}
    try:
        _request(client, "POST", f"{path}/snapshot", {"tables": names})
        deadline = time.monotonic() + args.timeout
        while True:
            q = _request(client, "GET", path)
            if q.get("state") not in ("normal", "warning"):
                raise CliError("CDC:ErrChangefeedNotStreaming", f"the resync of {', '.join(names)} stopped: the "
                               f"changefeed is {q.get('state')} ({q.get('error')})", VERIFY_COULD_NOT_RUN)
            pending = [c for c in q.get("table_copies") or [] if c.get("table") in names]
            copying = [s for s in q.get("spans") or [] if (s.get("table_copy") or {}).get("phase") == "copying"]
            if not pending and not copying:
                break
            if time.monotonic() >= deadline:
                raise CliError("CDC:ErrTimeout", f"the resync of {', '.join(names)} took longer than {args.timeout}s",
                               VERIFY_COULD_NOT_RUN)
            time.sleep(0.5)
    except CliError as exc:
        raise CliError(exc.code, exc.message, VERIFY_COULD_NOT_RUN) from None
    again = _verify(client, path, args, ",".join(names))
    return {**again, "repaired": names, "before": run["report"]}


def _verify(client: Client, path: str, args: argparse.Namespace, tables: str | None) -> dict[str, Any]:
    """Start a verify job and wait for its report (progress on stderr); Ctrl-C stops the job (it releases its hold)
    and exits 130. A refused request or an unreachable server: exit 2 (could not run)."""
    body: dict[str, Any] = {}
    if tables:
        body["tables"] = [t.strip() for t in tables.split(",") if t.strip()]
    if args.chunk_rows is not None:
        body["chunk_rows"] = args.chunk_rows
    try:
        run = _request(client, "POST", f"{path}/verify", body)
    except CliError as exc:
        raise CliError(exc.code, exc.message, VERIFY_COULD_NOT_RUN) from None
    run_path = f"{path}/verify/{_seg(str(run['id']))}"
    deadline = time.monotonic() + args.timeout
    shown = VerifyProgress(sys.stderr)
    try:
        while run.get("state") == "running":
            shown.show(run)
            if time.monotonic() >= deadline:
                _request(client, "DELETE", run_path)
                raise CliError("CDC:ErrTimeout", f"verify run {run['id']} took longer than {args.timeout}s: "
                               "stopped", VERIFY_COULD_NOT_RUN)
            time.sleep(0.5)
            try:
                run = _request(client, "GET", run_path)
            except CliError as exc:
                raise CliError(exc.code, exc.message, VERIFY_COULD_NOT_RUN) from None
    except KeyboardInterrupt:
        try:
            _request(client, "DELETE", run_path, timeout=10)
        except CliError:
            pass  # the hold expires by its deadline
        raise CliError("CDC:ErrInterrupted", f"verify run {run['id']} stopped (its hold released)", 130) from None
    finally:
        shown.close()
    return run


def _watch(server: str, path: str) -> dict[str, Any]:
    """The initial copy's progress on stderr (a bar on a terminal, plain lines elsewhere) until the changefeed
    streams; a changefeed that fails or stops instead ends it with exit code 1 and the reason."""
    try:
        return watch(lambda: _request(server, "GET", path), sys.stderr)
    except WatchEnded as exc:
        raise CliError("CDC:ErrChangefeedNotStreaming", str(exc)) from None
    except KeyboardInterrupt:
        raise CliError("CDC:ErrInterrupted", "stopped watching (the changefeed goes on)", 130) from None


def _cmd_capture(args: argparse.Namespace) -> Result:
    if args.op == "list":
        return "captures", _request(args.server, "GET", "/api/v2/captures")
    if args.op == "drain":
        return "object", _drain(args)
    raise CliError("CDC:ErrUsage", f"unknown capture command {args.op}", 2)


def _drain(args: argparse.Namespace) -> dict[str, Any]:
    """``--self``: the capture behind ``--server`` (a Kubernetes preStop hook does not know its capture id).
    ``--wait S``: return once the capture holds no span (or after S seconds, exit code 1); a lone capture, which
    cannot be drained, is reported and not waited for (its SIGTERM stops the spans)."""
    if bool(args.capture_id) == bool(args.self):
        raise CliError("CDC:ErrUsage", "give exactly one of --capture-id or --self", 2)
    cid = args.capture_id or str(_request(args.server, "GET", "/api/v2/status")["id"])
    try:
        result = _request(args.server, "POST", f"/api/v2/captures/{_seg(cid)}/drain")
    except CliError as exc:
        if args.self and exc.code == "CDC:ErrCaptureStateConflict":
            return {"id": cid, "draining": False, "remaining_spans": None, "message": exc.message}
        raise
    deadline = time.monotonic() + (args.wait or 0.0)
    while args.wait and result.get("remaining_spans"):
        if time.monotonic() >= deadline:
            raise CliError("CDC:ErrTimeout", f"capture {cid} still holds {result['remaining_spans']} span(s) after "
                           f"{args.wait}s of draining")
        time.sleep(0.5)
        caps = _request(args.server, "GET", "/api/v2/captures")
        mine = [c for c in (caps.get("items", caps) if isinstance(caps, dict) else caps) if c.get("id") == cid]
        result = {**result, "remaining_spans": mine[0].get("spans", 0) if mine else 0}
    return result


def _cmd_processor(args: argparse.Namespace) -> Result:
    if args.op == "list":
        return "processors", _request(args.server, "GET", "/api/v2/processors")["items"]
    if args.op == "query":
        return "processor", _request(args.server, "GET",
                                     f"/api/v2/processors/{_seg(args.changefeed_id)}/{_seg(args.capture_id)}")
    raise CliError("CDC:ErrUsage", f"unknown processor command {args.op}", 2)


def _cmd_owner(args: argparse.Namespace) -> Result:
    if args.op == "resign":
        return "object", _request(args.server, "POST", "/api/v2/owner/resign", {})
    raise CliError("CDC:ErrUsage", f"unknown owner command {args.op}", 2)


COMMANDS: dict[str, Callable[[argparse.Namespace], Result]] = {
    "changefeed": _cmd_changefeed, "capture": _cmd_capture, "processor": _cmd_processor, "owner": _cmd_owner,
}


def _add_server_parser(sub: Any) -> None:
    p = sub.add_parser("server", help="run a capture process")
    p.add_argument("--etcd", help="comma-separated etcd endpoints (default http://127.0.0.1:2379)")
    p.add_argument("--addr", help="HOST:PORT for the HTTP API (default 127.0.0.1:8300)")
    p.add_argument("--data-dir", help="local directory for the sorter")
    p.add_argument("--cluster-id", help="cluster id (etcd key prefix), default 'default'")
    p.add_argument("--config", help="server config TOML")
    p.add_argument("--log-file")
    p.add_argument("--log-level")
    p.add_argument("--gc-ttl", type=float, help="seconds a stopped or failed changefeed keeps its upstream slots "
                   "before they are released and it fails for good (default 86400 = 24 h)")
    p.add_argument("--auth-token-file", help="API tokens, one per line: required for every mutating route "
                   "(else $TIDEWATER_AUTH_TOKEN_FILE or $TIDEWATER_AUTH_TOKEN)")
    p.add_argument("--auth-read", choices=("open", "protected"), help="GET routes need a token too (default open)")
    p.add_argument("--cert", "--tls-cert", dest="tls_cert", help="PEM certificate: the API speaks HTTPS")
    p.add_argument("--key", "--tls-key", dest="tls_key", help="PEM private key of --cert")
    p.add_argument("--ca", "--tls-ca", dest="tls_ca", help="CA for client certificates and other captures")
    p.add_argument("--client-auth", "--tls-client-auth", dest="tls_client_auth", action="store_const", const=True,
                   help="mutual TLS: require client certificates signed by --ca")
    p.add_argument("--secret-key-file", help="Fernet keys (first seals) for changefeed credentials in etcd "
                   "(else $TIDEWATER_SECRET_KEY_FILE; `cdc secret-key generate` makes one)")
    p.add_argument("--log-format", choices=("text", "json"), help="log line format (default text)")
    p.add_argument("--log-max-bytes", type=int, help="rotate --log-file beyond this size (default 0: never)")
    p.add_argument("--log-backups", type=int, help="rotated log files kept (default 5)")


def _add_cli_parser(sub: Any) -> None:
    # --server and --output may also follow the subcommand (`cdc cli changefeed list --output table`)
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--server", default=argparse.SUPPRESS, help=f"server URL (default {DEFAULT_SERVER})")
    out.add_argument("--output", "-o", choices=OUTPUTS, default=argparse.SUPPRESS,
                     help="json (default) or table (aligned text for humans)")

    p = sub.add_parser("cli", help="operate a cluster through a server's HTTP API")
    p.add_argument("--server", default=None, help=f"server URL (else ${ENV_SERVER}, the client config, "
                   f"{DEFAULT_SERVER})")
    p.add_argument("--output", "-o", choices=OUTPUTS, default="json",
                   help="json (default) or table (aligned text for humans)")
    p.add_argument("--token-file", help=f"file holding the API token (else ${ENV_TOKEN_FILE}, ${ENV_TOKEN}, "
                   "the client config)")
    p.add_argument("--ca", help=f"CA to verify an https server (else ${ENV_CA})")
    p.add_argument("--cert", help=f"client certificate for mutual TLS (else ${ENV_CERT})")
    p.add_argument("--key", help=f"key of --cert (else ${ENV_KEY})")
    p.add_argument("--client-config", help=f"TOML with {', '.join(CLIENT_CONFIG_KEYS)} (else ${ENV_CLIENT_CONFIG})")
    groups = p.add_subparsers(dest="group", required=True)

    cf = groups.add_parser("changefeed", help="manage changefeeds")
    ops = cf.add_subparsers(dest="op", required=True)
    c = ops.add_parser("create", parents=[out], help="create a changefeed")
    c.add_argument("--upstream", help=f"postgresql://user@host:port/db or mysql://user@host:port/db (or --upstream-file, ${ENV_UPSTREAM})")
    c.add_argument("--upstream-file", help="file whose first line is the upstream URI (keeps it out of `ps`)")
    c.add_argument("--sink-uri", help=f"{', '.join(SINK_URI_FORMS.values())} (or --sink-uri-file, ${ENV_SINK})")
    c.add_argument("--sink-uri-file", help="file whose first line is the sink URI")
    c.add_argument("--changefeed-id", "-c", required=True)
    c.add_argument("--config", help="changefeed TOML (filter rules, span-count, sink options)")
    c.add_argument("--target-ts", type=int, default=0)
    c.add_argument("--wait", action="store_true",
                   help="show the initial copy's progress (a bar on a terminal, lines otherwise) until it streams")
    c.add_argument("--snapshot", choices=("initial", "none"),
                   help="copy the rows that exist first (initial, the default), or stream changes only (none); "
                        "overrides [snapshot] mode of --config")
    ops.add_parser("list", parents=[out], help="list changefeeds")
    helps = {"query": "show one changefeed", "pause": "stop replicating (slots keep the changes)",
             "resume": "start replicating again; acknowledges its errors and data warnings so far",
             "remove": "remove (drops slots and publications)"}
    for name, text in helps.items():
        q = ops.add_parser(name, parents=[out], help=text)
        q.add_argument("--changefeed-id", "-c", required=True)
        if name == "query":
            q.add_argument("--watch", action="store_true",
                           help="show the initial copy's progress until the changefeed streams")
        if name == "remove":
            q.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the removal")
    r = ops.add_parser("snapshot", parents=[out],
                       help="copy tables again (resync) while the changefeed streams: each is emptied downstream "
                            "and copied under a new snapshot; only its own changes wait meanwhile")
    r.add_argument("--changefeed-id", "-c", required=True)
    r.add_argument("--table", action="append", required=True, metavar="SCHEMA.NAME",
                   help="a replicated table (repeat for several)")
    v = ops.add_parser("verify", parents=[out],
                       help="compare the target with the upstream at one consistent point, chunk by chunk on Spark; "
                            "exit 0 equal, 1 differs, 2 could not run")
    v.add_argument("--changefeed-id", "-c", required=True)
    v.add_argument("--tables", metavar="SCHEMA.NAME,...", help="replicated tables to compare (default: all)")
    v.add_argument("--chunk-rows", type=int, help="rows per compared chunk (default: [snapshot] chunk-rows)")
    v.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds to wait for the report")
    v.add_argument("--repair", action="store_true",
                   help="resync the tables that differ (changefeed snapshot), then verify them again; the exit code "
                        "is the second verification's")
    u = ops.add_parser("update", parents=[out], help="change a stopped changefeed; prints the diff")
    u.add_argument("--changefeed-id", "-c", required=True)
    u.add_argument("--sink-uri")
    u.add_argument("--sink-uri-file", help="file whose first line is the new sink URI")
    u.add_argument("--upstream", help="same server and database, e.g. new credentials; or, for MariaDB, a promoted "
                                      "replica holding the changefeed's GTIDs (docs/upstream-mysql.md, failover)")
    u.add_argument("--upstream-file", help="file whose first line is the new upstream URI")
    u.add_argument("--config", help="a whole changefeed TOML (span-count cannot change)")
    u.add_argument("--target-ts", type=int)
    u.add_argument("--skip-ddl-ts", type=int,
                   help="skip the schema change(s) of the upstream transaction committed at this Ts (named in the "
                        "changefeed's DDL error), knowingly: the target keeps its schema")

    cap = groups.add_parser("capture", help="list or drain captures")
    cap_ops = cap.add_subparsers(dest="op", required=True)
    cap_ops.add_parser("list", parents=[out], help="list live captures")
    d = cap_ops.add_parser("drain", parents=[out], help="move every span off a capture")
    which = d.add_mutually_exclusive_group(required=True)
    which.add_argument("--capture-id")
    which.add_argument("--self", action="store_true", help="drain the capture that --server points at (preStop hooks)")
    d.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait until the capture holds no span (exit code 1 after SECONDS)")

    proc = groups.add_parser("processor", help="list or query processors")
    proc_ops = proc.add_subparsers(dest="op", required=True)
    proc_ops.add_parser("list", parents=[out], help="one line per (changefeed, capture)")
    pq = proc_ops.add_parser("query", parents=[out], help="the spans of a changefeed on one capture")
    pq.add_argument("--changefeed-id", "-c", required=True)
    pq.add_argument("--capture-id", required=True)

    own = groups.add_parser("owner", help="owner operations")
    own_ops = own.add_subparsers(dest="op", required=True)
    own_ops.add_parser("resign", parents=[out], help="make the owner resign (another election follows)")

    _add_kafka_consumer_parser(groups)


def _add_kafka_consumer_parser(groups: Any) -> None:
    p = groups.add_parser("kafka-consumer", help="rebuild tables from a Kafka sink's topics into an SQL target")
    p.add_argument("--kafka-uri", help="the changefeed's kafka:// sink URI: brokers, topic, protocol, TLS, SASL")
    p.add_argument("--kafka-uri-file", help="a file whose first line is the kafka:// URI (keeps a password out of ps)")
    p.add_argument("--broker", action="append", help="host:port of a broker (repeatable; without --kafka-uri)")
    p.add_argument("--topic", action="append",
                   help="topic to read, every partition (repeatable: the cut is the minimum over all of them)")
    p.add_argument("--protocol", choices=KAFKA_PROTOCOLS)
    p.add_argument("--sink-uri", required=True, help="the target: sqlite:///file.db, postgresql://..., mysql://...")
    p.add_argument("--upstream", help="postgresql://... of the upstream: exact column types and key-only rows")
    p.add_argument("--until-ts", type=int, help="exit once everything up to this commit Ts is applied")
    p.add_argument("--timeout", type=float, help="give up after this many seconds")
    p.add_argument("--position", help="the consumer's position name in the target (default kafka:<topics>)")
    p.add_argument("--meta-topic", help="the sink's metadata topic, read for the copies' chunk markers (default "
                   "_tidewater.<the sink URI's topic>, or of the first --topic without --kafka-uri)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc", description="Tidewater change-data-capture")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_server_parser(sub)
    _add_cli_parser(sub)
    sub.add_parser("version")
    key = sub.add_parser("secret-key", help="keys sealing changefeed credentials in etcd")
    key.add_argument("op", choices=("generate",), help="print a new key (put it first in --secret-key-file)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    # Lazy on purpose, measured: the modules of `cdc server` (capture.server) and of `cdc cli kafka-consumer` (the Kafka
    # sink and kafka-python, an optional extra) import everything they need at their top, and only the command that
    # runs them imports them. Imported here at module top they cost every other command about 0.2 s each
    # (`python -X importtime`): `cdc --help` and `cdc cli changefeed list` took 0.51-0.54 s of CPU instead of
    # 0.08-0.10 s (best of 7, 2-core host), and without the kafka extra no `cdc` command would start at all.
    if args.command == "version":
        from capture.server import VERSION

        print(json.dumps({"version": VERSION}, indent=2))
        return 0
    if args.command == "server":
        from cli import server

        return server.run(args)
    if args.command == "secret-key":
        print(generate_key())
        return 0
    if args.group == "kafka-consumer":  # talks to Kafka and the target, not to a server
        from cli import kafka_consumer

        return kafka_consumer.run(args)
    try:
        args.server = make_client(args)
        kind, result = COMMANDS[args.group](args)
        print(emit(kind, result, args.output))
        return verify_exit_code(result) if kind == "verify" else 0
    except CliError as exc:
        print(json.dumps({"error_code": exc.code, "error_msg": scrub(exc.message)}, indent=2), file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
