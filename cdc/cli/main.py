"""The `cdc` command: `cdc server ...` runs a capture; `cdc cli ...` talks to a server's HTTP API.

Output is JSON on stdout. Errors are one JSON object ``{"error_code", "error_msg"}`` on stderr and a
non-zero exit code (1 for a refused request, 2 for bad usage, 3 when the server is unreachable).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_SERVER = "http://127.0.0.1:8300"


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


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _cmd_changefeed(args: argparse.Namespace) -> Any:
    s = args.server
    op = args.op
    if op == "create":
        config = ""
        if args.config:
            try:
                config = Path(args.config).read_text()
            except OSError as exc:
                raise CliError("CDC:ErrInvalidConfig", f"cannot read config file {args.config}: {exc}") from exc
        return _request(s, "POST", "/api/v2/changefeeds", {
            "changefeed_id": args.changefeed_id, "upstream_uri": args.upstream, "sink_uri": args.sink_uri,
            "config": config, "target_ts": args.target_ts})
    if op == "list":
        return _request(s, "GET", "/api/v2/changefeeds")["items"]
    if op == "query":
        return _request(s, "GET", f"/api/v2/changefeeds/{args.changefeed_id}")
    if op in ("pause", "resume"):
        return _request(s, "POST", f"/api/v2/changefeeds/{args.changefeed_id}/{op}")
    if op == "remove":
        result = _request(s, "DELETE", f"/api/v2/changefeeds/{args.changefeed_id}")
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                _request(s, "GET", f"/api/v2/changefeeds/{args.changefeed_id}")
            except CliError as exc:
                if exc.code == "CDC:ErrChangefeedNotFound":
                    return {"id": args.changefeed_id, "removed": True}
                raise
            time.sleep(0.5)
        raise CliError("CDC:ErrTimeout", f"changefeed {args.changefeed_id} is marked removed but the owner has not "
                       f"finished dropping its slots within {args.timeout}s; state: {result.get('state')}")
    raise CliError("CDC:ErrUsage", f"unknown changefeed command {op}", 2)


def _add_server_parser(sub: Any) -> None:
    p = sub.add_parser("server", help="run a capture process")
    p.add_argument("--etcd", help="comma-separated etcd endpoints (default http://127.0.0.1:2379)")
    p.add_argument("--addr", help="HOST:PORT for the HTTP API (default 127.0.0.1:8300)")
    p.add_argument("--data-dir", help="local directory for the sorter")
    p.add_argument("--cluster-id", help="cluster id (etcd key prefix), default 'default'")
    p.add_argument("--config", help="server config TOML")
    p.add_argument("--log-file")
    p.add_argument("--log-level")


def _add_cli_parser(sub: Any) -> None:
    p = sub.add_parser("cli", help="operate a cluster through a server's HTTP API")
    p.add_argument("--server", default=DEFAULT_SERVER, help=f"server URL (default {DEFAULT_SERVER})")
    groups = p.add_subparsers(dest="group", required=True)
    cf = groups.add_parser("changefeed", help="manage changefeeds")
    ops = cf.add_subparsers(dest="op", required=True)
    c = ops.add_parser("create")
    c.add_argument("--upstream", required=True, help="postgresql://user@host:port/db")
    c.add_argument("--sink-uri", required=True, help="mysql://..., postgresql://..., sqlite:///path, blackhole://")
    c.add_argument("--changefeed-id", "-c", required=True)
    c.add_argument("--config", help="changefeed TOML (filter rules, span-count, sink options)")
    c.add_argument("--target-ts", type=int, default=0)
    ops.add_parser("list")
    for name in ("query", "pause", "resume", "remove"):
        q = ops.add_parser(name)
        q.add_argument("--changefeed-id", "-c", required=True)
        if name == "remove":
            q.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the removal")
    cap = groups.add_parser("capture", help="list captures")
    cap_ops = cap.add_subparsers(dest="op", required=True)
    cap_ops.add_parser("list")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cdc", description="Tidewater change-data-capture")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_server_parser(sub)
    _add_cli_parser(sub)
    sub.add_parser("version")
    args = parser.parse_args(argv)

    if args.command == "version":
        from capture.server import VERSION

        _print({"version": VERSION})
        return 0
    if args.command == "server":
        return _run_server(args)
    try:
        if args.group == "changefeed":
            _print(_cmd_changefeed(args))
        elif args.group == "capture":
            _print(_request(args.server, "GET", "/api/v2/captures"))
        return 0
    except CliError as exc:
        print(json.dumps({"error_code": exc.code, "error_msg": exc.message}, indent=2), file=sys.stderr)
        return exc.exit_code


def _run_server(args: argparse.Namespace) -> int:
    from capture.logsetup import setup_logging
    from capture.server import serve
    from cdc.config import ServerConfig
    from cdc.errors import TidewaterError

    try:
        text = Path(args.config).read_text() if args.config else ""
        config = ServerConfig.from_toml(text, etcd=args.etcd, addr=args.addr, data_dir=args.data_dir,
                                        cluster_id=args.cluster_id, log_file=args.log_file, log_level=args.log_level)
    except (OSError, TidewaterError) as exc:
        print(json.dumps({"error_code": getattr(exc, "code", "CDC:ErrInvalidConfig"), "error_msg": str(exc)}),
              file=sys.stderr)
        return 2
    setup_logging(config.log_level, config.log_file)
    try:
        return serve(config)
    except TidewaterError as exc:
        print(json.dumps(exc.to_dict()), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
