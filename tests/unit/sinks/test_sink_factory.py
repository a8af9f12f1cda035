"""The lazy sink registry, URI errors, and the blackhole sink."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cdc.config import SinkConfig
from cdc.errors import InvalidURI, SinkError
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks import factory
from sinks.blackhole import BlackholeSink
from sinks.factory import open_sink, register_sink, sink_class
from sinks.sql.sink import SQLSink

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("uri,dialect", [
    ("mysql://root@127.0.0.1:3306/db", "mysql"),
    ("mariadb://u:p@db.example/db", "mysql"),
    ("postgresql://postgres@127.0.0.1:5432/db", "postgresql"),
    ("postgres://h/db?sslmode=require", "postgresql"),
    ("sqlite:///relative/file.db", "sqlite"),
    ("sqlite:////abs/file.db", "sqlite"),
])
def test_sql_schemes_open_an_unconnected_sql_sink(uri: str, dialect: str) -> None:
    sink = open_sink(uri, SinkConfig(batch_rows=10))
    try:
        assert isinstance(sink, SQLSink)
        assert sink.dialect == dialect
    finally:
        sink.close()


def test_target_names_per_dialect() -> None:
    t = TableName("shop", "Orders")
    mysql, pg = open_sink("mysql://u@h/db"), open_sink("postgresql://u@h/db")
    try:
        assert mysql.target_name(t) == "Orders"
        assert pg.target_name(t) == "shop.Orders"
    finally:
        mysql.close()
        pg.close()


@pytest.mark.parametrize("uri,message", [
    ("", "malformed"),
    ("no-scheme", "malformed"),
    ("kafka://127.0.0.1:9092/topic", "names no protocol"),
    ("kafka://127.0.0.1:9092/topic?protocol=avro", "protocol .avro. is not supported"),
    ("ftp://x/y", "not supported"),
    ("mysql://root@127.0.0.1:3306/", "names no database"),
    ("mysql://127.0.0.1:notaport/db", "malformed"),
    ("postgresql:///db", "no host"),
    ("sqlite://", "sqlite:///path"),
    ("mysql://u@h/db?worker-count=4", "unknown parameter"),
    ("postgresql://u@h/db?connect-timeout=soon", "number of seconds"),
])
def test_malformed_or_unsupported_uris_raise_invalid_uri(uri: str, message: str) -> None:
    with pytest.raises(InvalidURI, match=message):
        open_sink(uri)


def test_a_broken_registry_entry_fails_when_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(factory.SINKS, "blackhole", "sinks.does_not_exist:Nothing")
    with pytest.raises(ModuleNotFoundError):
        open_sink("blackhole://")


def test_register_sink_maps_a_scheme_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factory, "SINKS", dict(factory.SINKS))
    register_sink("Null", "sinks.blackhole:BlackholeSink")
    assert sink_class("null") is BlackholeSink
    with pytest.raises(ValueError):
        register_sink("bad", "sinks.blackhole.BlackholeSink")
    with pytest.raises(InvalidURI):
        sink_class("unknown")


def test_a_non_sink_target_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factory, "SINKS", dict(factory.SINKS))
    register_sink("weird", "cdc.config:SinkConfig")
    with pytest.raises(TypeError):
        sink_class("weird")


def test_opening_a_blackhole_sink_imports_no_sql_driver() -> None:
    code = ("import sys; from sinks.factory import open_sink; s = open_sink('blackhole://'); "
            "print(type(s).__name__, 'sqlalchemy' in sys.modules, 'sinks.sql' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["BlackholeSink", "False", "False"]


def test_blackhole_counts_and_discards() -> None:
    schema = TableSchema(TableName("public", "t"), (ColumnSchema("id", 23, "int4", is_key=True),), ("id",))
    sink = open_sink("blackhole://")
    assert isinstance(sink, BlackholeSink)
    sink.check()
    changes = (RowChange(OpType.INSERT, schema, i, values={"id": i}) for i in range(10))
    assert sink.write(changes) == 10
    assert sink.write([]) == 0
    assert (sink.rows, sink.writes) == (10, 2)
    sink.close()
    with pytest.raises(SinkError):
        sink.write([])


def test_every_sink_scheme_is_in_the_uri_rules_and_in_create_help(capsys: pytest.CaptureFixture[str]) -> None:
    """The factory's schemes, the URI parser's and those ``changefeed create --help`` lists are one list (kafka://
    and file:// were once missing from the help)."""
    from cdc.uri import SINK_SCHEMES, SINK_URI_FORMS
    from cli.main import build_parser

    assert set(SINK_SCHEMES) == set(factory.SINKS) == set(SINK_URI_FORMS)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cli", "changefeed", "create", "--help"])
    text = "".join(capsys.readouterr().out.split())  # (argparse wraps lines at spaces and hyphens)
    for scheme, form in SINK_URI_FORMS.items():
        assert form.startswith(f"{scheme}://")
        assert form in text, f"{scheme}:// missing from `changefeed create --help`"
