"""``cdc server``: one capture process (:func:`capture.server.serve`) under the server config of the flags and
``--config`` (read again on SIGHUP)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capture.logsetup import setup_logging
from capture.server import serve
from cdc.config import ServerConfig
from cdc.errors import TidewaterError
from cdc.uri import scrub


def run(args: argparse.Namespace) -> int:
    """Exit code 2 for a config that cannot be loaded, 1 when the server fails with a :class:`TidewaterError`."""

    def load() -> ServerConfig:  # also on SIGHUP: the file again, under the same flags
        text = Path(args.config).read_text() if args.config else ""
        return ServerConfig.from_toml(
            text, etcd=args.etcd, addr=args.addr, data_dir=args.data_dir, cluster_id=args.cluster_id,
            log_file=args.log_file, log_level=args.log_level, gc_ttl=args.gc_ttl,
            auth_token_file=args.auth_token_file, auth_read=args.auth_read, tls_cert=args.tls_cert,
            tls_key=args.tls_key, tls_ca=args.tls_ca, tls_client_auth=args.tls_client_auth,
            secret_key_file=args.secret_key_file, log_format=args.log_format, log_max_bytes=args.log_max_bytes,
            log_backups=args.log_backups)

    try:
        config = load()
    except (OSError, TidewaterError) as exc:
        print(json.dumps({"error_code": getattr(exc, "code", "CDC:ErrInvalidConfig"),
                          "error_msg": scrub(getattr(exc, "message", None) or str(exc))}), file=sys.stderr)
        return 2
    setup_logging(config.log_level, config.log_file, log_format=config.log_format, max_bytes=config.log_max_bytes,
                  backups=config.log_backups, warn_interval=config.log_warn_interval)
    try:
        return serve(config, load if args.config else None)
    except TidewaterError as exc:
        print(json.dumps({"error_code": exc.code, "error_msg": scrub(exc.message)}), file=sys.stderr)
        return 1
