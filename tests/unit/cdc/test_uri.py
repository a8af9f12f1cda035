import pytest

from cdc.errors import InvalidURI
from cdc.uri import parse_sink_uri, parse_upstream_uri, redact

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("raw,expected", [
    ("mysql://app:secret@db:3306/shop", "mysql://app:***@db:3306/shop"),
    ("postgresql://u:p%40ss@h/db?sslmode=require", "postgresql://u:***@h/db?sslmode=require"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
])
def test_redact(raw: str, expected: str) -> None:
    assert redact(raw) == expected
    if raw.startswith(("mysql", "postgresql")):
        parsed = parse_sink_uri(raw)
        assert parsed.redacted() == expected


def test_errors_never_echo_passwords() -> None:
    with pytest.raises(InvalidURI) as exc:
        parse_upstream_uri("postgresql://u:hunter2@:99999/db")
    assert "hunter2" not in str(exc.value)


def test_sink_uri_rules() -> None:
    with pytest.raises(InvalidURI, match="names no database"):
        parse_sink_uri("mysql://root@127.0.0.1:3306")
    with pytest.raises(InvalidURI, match="not supported"):
        parse_sink_uri("redis://x")
    assert parse_sink_uri("sqlite:////abs/path.db").path == "/abs/path.db"
