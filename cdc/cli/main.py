"""The `cdc` command: `cdc server ...` runs a capture; `cdc cli ...` talks to a server's HTTP API.

Output is JSON on stdout by default; ``cdc cli --output table ...`` prints plain aligned text for humans
(lists as tables; one object as ``key: value`` lines, plus a table of its spans). Errors are always one
JSON object ``{"error_code", "error_msg"}`` on stderr and a non-zero exit code: 1 for a refused
request, 2 for bad usage, 3 when the server is unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_SERVER = "http://127.0.0.1:8300"
OUTPUTS = ("json", "table")


class CliError(Exception):
    def __init__(self, code: str, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code


def _request(server: str, method: str, path: str, body: Any = None, timeout: float = 120.0) -> Any:
    url = server.rstrip("/") + path
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
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
        created = _request(s, "POST", "/api/v2/changefeeds", {
            "changefeed_id": args.changefeed_id, "upstream_uri": args.upstream, "sink_uri": args.sink_uri,
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
    if op == "update":
        body: dict[str, Any] = {}
        if args.sink_uri is not None:
            body["sink_uri"] = args.sink_uri
        if args.upstream is not None:
            body["upstream_uri"] = args.upstream
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


def _watch(server: str, path: str) -> dict[str, Any]:
    """The initial copy's progress on stderr (a bar on a terminal, plain lines elsewhere) until the changefeed
    streams; a changefeed that fails or stops instead ends it with exit code 1 and the reason."""
    from cdc.cli.progress import WatchEnded, watch

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


# ---- table output ------------------------------------------------------------------------------------
def cell(value: Any) -> str:
    """One value as table text: None -> '-', bools lower-case, floats rounded, errors as 'CODE: message',
    other containers as compact JSON; newlines flattened."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    if isinstance(value, dict) and "code" in value and "message" in value:
        return f"{value['code']}: {value['message']}".replace("\n", " ")
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value).replace("\n", " ")


Column = tuple[str, Callable[[dict[str, Any]], Any]]


def col(header: str, key: str) -> Column:
    return header, lambda row: row.get(key)


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """A plain text table: upper-case headers, columns left-aligned and separated by two spaces, no
    trailing blanks. Empty ``rows`` give the header line only."""
    grid = [[h.upper() for h, _ in columns]] + [[cell(get(r)) for _, get in columns] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in grid)


def render_kv(pairs: Sequence[tuple[str, Any]]) -> str:
    """``key:  value`` lines with the values aligned."""
    if not pairs:
        return ""
    width = max(len(k) for k, _ in pairs) + 1
    return "\n".join(f"{(k + ':').ljust(width)}  {cell(v)}".rstrip() for k, v in pairs)


def _lag(seconds: Any) -> str | None:
    return None if seconds is None else f"{cell(float(seconds))}s"


def _time(unix: Any) -> str | None:
    """A unix time as UTC ``YYYY-MM-DD HH:MM:SS``."""
    if not unix:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(unix)))


CHANGEFEED_COLUMNS: list[Column] = [
    col("id", "id"), col("state", "state"), col("checkpoint", "checkpoint"),
    ("checkpoint lag", lambda r: _lag(r.get("checkpoint_lag"))), col("warnings", "warnings"), col("error", "error")]
SPAN_COLUMNS: list[Column] = [
    col("span", "index"), col("capture", "capture"), col("slot", "slot"), col("publication", "publication"),
    col("checkpoint", "checkpoint"), col("running", "running"), col("rows", "rows"), col("error", "error")]
CAPTURE_COLUMNS: list[Column] = [
    col("id", "id"), col("address", "address"), col("owner", "is_owner"), col("draining", "draining"),
    col("spans", "spans"), col("version", "version"), col("pid", "pid")]
PROCESSOR_COLUMNS: list[Column] = [
    col("changefeed", "changefeed_id"), col("capture", "capture_id"),
    ("spans", lambda r: ",".join(str(s["index"]) for s in r.get("spans", []))), col("checkpoint", "checkpoint"),
    ("errors", lambda r: len(r.get("errors") or []))]
PROCESSOR_SPAN_COLUMNS: list[Column] = [
    col("span", "index"), col("epoch", "epoch"), col("checkpoint", "checkpoint"),
    ("checkpoint lag", lambda r: _lag(r.get("checkpoint_lag"))), ("resolved lag", lambda r: _lag(r.get("resolved_lag"))),
    col("running", "running"), col("rows", "rows"), col("error", "error")]
WARNING_COLUMNS: list[Column] = [
    col("severity", "severity"), col("code", "code"), col("table", "table"), col("count", "count"),
    ("keys", lambda r: ", ".join(r.get("keys") or []) or None),
    ("first", lambda r: _time(r.get("first_time"))), ("last", lambda r: _time(r.get("last_time"))),
    col("message", "message")]
DIFF_COLUMNS: list[Column] = [
    col("field", "field"), col("old", "old"), col("new", "new")]


def _changefeed_text(cf: dict[str, Any]) -> str:
    pairs = [("id", cf.get("id")), ("state", cf.get("state")), ("upstream", cf.get("upstream_uri")),
             ("sink", cf.get("sink_uri")), ("start ts", cf.get("start_ts")), ("target ts", cf.get("target_ts")),
             ("checkpoint", cf.get("checkpoint")), ("checkpoint ts", cf.get("checkpoint_ts")),
             ("checkpoint lag", _lag(cf.get("checkpoint_lag"))), ("resolved ts", cf.get("resolved_ts")),
             ("resolved lag", _lag(cf.get("resolved_lag"))), ("error", cf.get("error"))]
    text = render_kv(pairs) + "\n\n" + render_table(cf.get("spans") or [], SPAN_COLUMNS)
    warnings = cf.get("warnings") or []
    if warnings:
        text += "\n\ndata warnings (cdc cli changefeed resume acknowledges them):\n"
        text += render_table(warnings, WARNING_COLUMNS)
    return text


def _processor_text(p: dict[str, Any]) -> str:
    pairs = [("changefeed", p.get("changefeed_id")), ("capture", p.get("capture_id")),
             ("address", p.get("address")), ("checkpoint", p.get("checkpoint")),
             ("checkpoint ts", p.get("checkpoint_ts")), ("resolved ts", p.get("resolved_ts")),
             ("errors", len(p.get("errors") or []))]
    return render_kv(pairs) + "\n\n" + render_table(p.get("spans") or [], PROCESSOR_SPAN_COLUMNS)


def _update_text(result: dict[str, Any]) -> str:
    diff = result.get("diff") or {}
    if not diff:
        return f"changefeed {result.get('changefeed', {}).get('id')}: nothing changed"
    rows = [{"field": k, "old": v.get("old"), "new": v.get("new")} for k, v in sorted(diff.items())]
    return render_table(rows, DIFF_COLUMNS)


def format_table(kind: str, result: Any) -> str:
    """The ``--output table`` text of a command result (``kind`` from the command)."""
    if kind == "changefeeds":
        return render_table(result, CHANGEFEED_COLUMNS)
    if kind == "changefeed":
        return _changefeed_text(result)
    if kind == "captures":
        return render_table(result, CAPTURE_COLUMNS)
    if kind == "processors":
        return render_table(result, PROCESSOR_COLUMNS)
    if kind == "processor":
        return _processor_text(result)
    if kind == "update":
        return _update_text(result)
    if isinstance(result, dict):
        return render_kv(list(result.items()))
    return cell(result)


def emit(kind: str, result: Any, output: str) -> str:
    if output == "table":
        return format_table(kind, result)
    return json.dumps(result, indent=2, default=str)


# ---- argument parsing --------------------------------------------------------------------------------
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


def _add_cli_parser(sub: Any) -> None:
    # --server and --output may also follow the subcommand (`cdc cli changefeed list --output table`)
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--server", default=argparse.SUPPRESS, help=f"server URL (default {DEFAULT_SERVER})")
    out.add_argument("--output", "-o", choices=OUTPUTS, default=argparse.SUPPRESS,
                     help="json (default) or table (aligned text for humans)")

    p = sub.add_parser("cli", help="operate a cluster through a server's HTTP API")
    p.add_argument("--server", default=DEFAULT_SERVER, help=f"server URL (default {DEFAULT_SERVER})")
    p.add_argument("--output", "-o", choices=OUTPUTS, default="json",
                   help="json (default) or table (aligned text for humans)")
    groups = p.add_subparsers(dest="group", required=True)

    cf = groups.add_parser("changefeed", help="manage changefeeds")
    ops = cf.add_subparsers(dest="op", required=True)
    c = ops.add_parser("create", parents=[out], help="create a changefeed")
    c.add_argument("--upstream", required=True, help="postgresql://user@host:port/db")
    c.add_argument("--sink-uri", required=True, help="mysql://..., postgresql://..., sqlite:///path, blackhole://")
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
    u = ops.add_parser("update", parents=[out], help="change a stopped changefeed; prints the diff")
    u.add_argument("--changefeed-id", "-c", required=True)
    u.add_argument("--sink-uri")
    u.add_argument("--upstream", help="same server and database, e.g. new credentials")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc", description="Tidewater change-data-capture")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_server_parser(sub)
    _add_cli_parser(sub)
    sub.add_parser("version")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    if args.command == "version":
        from capture.server import VERSION

        print(json.dumps({"version": VERSION}, indent=2))
        return 0
    if args.command == "server":
        return _run_server(args)
    try:
        kind, result = COMMANDS[args.group](args)
        print(emit(kind, result, args.output))
        return 0
    except CliError as exc:
        print(json.dumps({"error_code": exc.code, "error_msg": exc.message}, indent=2), file=sys.stderr)
        return exc.exit_code


def _run_server(args: argparse.Namespace) -> int:
    from capture.logsetup import setup_logging
    from capture.server import serve
    from cdc.config import ServerConfig
    from cdc.errors import TidewaterError

    def load() -> ServerConfig:  # also on SIGHUP: the file again, under the same flags
        text = Path(args.config).read_text() if args.config else ""
        return ServerConfig.from_toml(text, etcd=args.etcd, addr=args.addr, data_dir=args.data_dir,
                                      cluster_id=args.cluster_id, log_file=args.log_file, log_level=args.log_level,
                                      gc_ttl=args.gc_ttl)

    try:
        config = load()
    except (OSError, TidewaterError) as exc:
        print(json.dumps({"error_code": getattr(exc, "code", "CDC:ErrInvalidConfig"), "error_msg": str(exc)}),
              file=sys.stderr)
        return 2
    setup_logging(config.log_level, config.log_file)
    try:
        return serve(config, load if args.config else None)
    except TidewaterError as exc:
        print(json.dumps(exc.to_dict()), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
