"""Where `cdc cli` finds its server, token, TLS files and URIs (issue 12, item 7): flags, then the
environment, then a client config file, so that no secret needs to be on the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cli.args import CliError, uri_arg
from cli.main import build_parser, main, make_client

pytestmark = pytest.mark.unit


def cli_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["cli", *argv, "changefeed", "list"])


def test_precedence_flags_env_config(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("# rotated 2026-11\nfile-token-0123456789\n")
    conf = tmp_path / "cli.toml"
    conf.write_text('server = "http://conf:1"\ntoken = "conf-token-0123456789"\n')
    env = {"TIDEWATER_CLI_CONFIG": str(conf)}
    c = make_client(cli_args(), env)
    assert (c.server, c.token, c.tls) == ("http://conf:1", "conf-token-0123456789", None)
    env |= {"TIDEWATER_SERVER": "http://env:2", "TIDEWATER_AUTH_TOKEN": "env-token-0123456789"}
    c = make_client(cli_args(), env)
    assert (c.server, c.token) == ("http://env:2", "env-token-0123456789")
    env["TIDEWATER_AUTH_TOKEN_FILE"] = str(tmp_path / "token")
    assert make_client(cli_args(), env).token == "file-token-0123456789"
    c = make_client(cli_args("--server", "http://flag:3"), env)
    assert c.server == "http://flag:3"
    assert make_client(cli_args(), {}).server == "http://127.0.0.1:8300" and make_client(cli_args(), {}).token == ""
    assert make_client(cli_args("--server", "https://x:1"), {}).tls is not None  # https: system CAs


def test_bad_client_settings_exit_2(tmp_path: Path) -> None:
    conf = tmp_path / "cli.toml"
    conf.write_text('servr = "x"\n')
    with pytest.raises(CliError, match="unknown key") as exc:
        make_client(cli_args("--client-config", str(conf)), {})
    assert exc.value.exit_code == 2
    with pytest.raises(CliError, match="cannot read the API token file"):
        make_client(cli_args("--token-file", str(tmp_path / "missing")), {})
    with pytest.raises(CliError, match="cannot load TLS files"):
        make_client(cli_args("--ca", str(tmp_path / "missing.pem")), {})


def test_uris_from_files_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "up.uri").write_text("postgresql://repl:Pa%40ss@db1/shop\n")
    args = build_parser().parse_args(["cli", "changefeed", "create", "-c", "x", "--upstream-file",
                                      str(tmp_path / "up.uri")])
    assert uri_arg(args, "upstream", "TIDEWATER_UPSTREAM_URI", "upstream URI", True) == \
        "postgresql://repl:Pa%40ss@db1/shop"
    monkeypatch.setenv("TIDEWATER_SINK_URI", "mysql://app:S3cret-pw@db2/shop")
    assert uri_arg(args, "sink_uri", "TIDEWATER_SINK_URI", "sink URI", True) == "mysql://app:S3cret-pw@db2/shop"
    monkeypatch.delenv("TIDEWATER_SINK_URI")
    with pytest.raises(CliError, match="--sink-uri-file FILE or \\$TIDEWATER_SINK_URI") as exc:
        uri_arg(args, "sink_uri", "TIDEWATER_SINK_URI", "sink URI", True)
    assert exc.value.exit_code == 2
    # an unreachable server: the error names the server, never the password of the URI being sent
    monkeypatch.setenv("TIDEWATER_SINK_URI", "mysql://app:S3cret-pw@db2/shop")
    rc = main(["cli", "--server", "http://127.0.0.1:9", "changefeed", "create", "-c", "x", "--upstream-file",
               str(tmp_path / "up.uri")])
    err = json.loads(capsys.readouterr().err)
    assert rc == 3 and err["error_code"] == "CDC:ErrServerUnreachable"
    assert "S3cret-pw" not in json.dumps(err) and "Pa%40ss" not in json.dumps(err)
