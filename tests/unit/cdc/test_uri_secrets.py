"""Passwords never shown, whatever characters they hold (issue 12, item 7): URIs as written by users,
libpq keyword DSNs, secret query parameters, and free text holding them (error messages, log lines)."""

from __future__ import annotations

import pytest

from cdc.errors import InvalidURI
from cdc.uri import parse_sink_uri, parse_upstream_uri, redact, remember_secret, scrub

pytestmark = pytest.mark.unit

SECRET = "Zq9-s3cr3t"


@pytest.mark.parametrize("raw,expected", [
    # a raw '@' in the password: the last '@' ends it (urlsplit reads it that way too)
    (f"postgresql://repl:{SECRET}@x@db1:5432/shop", "postgresql://repl:***@db1:5432/shop"),
    (f"postgresql://repl:{SECRET}:@db1/shop", "postgresql://repl:***@db1/shop"),
    (f"postgresql://repl:{SECRET}%25x@db1/shop", "postgresql://repl:***@db1/shop"),
    (f"mysql://app:a/{SECRET}@db2:3306/shop", "mysql://app:***@db2:3306/shop"),
    (f"mysql://app:a?{SECRET}@db2/shop", "mysql://app:***@db2/shop"),
    (f"postgresql://repl@db1/shop?sslmode=verify-full&sslpassword={SECRET}",
     "postgresql://repl@db1/shop?sslmode=verify-full&sslpassword=***"),
    (f"postgresql://repl@db1/shop?password={SECRET}&application_name=x",
     "postgresql://repl@db1/shop?password=***&application_name=x"),
    (f"postgresql://me@corp:{SECRET}@db1/shop", "postgresql://me@corp:***@db1/shop"),
    (f"host=db1 user=repl password={SECRET} dbname=shop", "host=db1 user=repl password=*** dbname=shop"),
    (f"host=db1 password='{SECRET} with space' dbname=shop", "host=db1 password=*** dbname=shop"),
    ("postgresql://repl@db1:5432/shop", "postgresql://repl@db1:5432/shop"),
    ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
    ("tidewater-enc:v1:gAAAAAB", "<encrypted>"),
])
def test_redact_hides_every_password(raw: str, expected: str) -> None:
    assert redact(raw) == expected
    assert SECRET not in redact(raw)


@pytest.mark.parametrize("raw", [
    f"postgresql://repl:{SECRET}@:99999/shop",       # bad port
    f"postgresql://repl:a/{SECRET}@db1/shop",          # '/' in the password: urlsplit sees port 'a'
    f"postgresql://repl:{SECRET}@/shop",                # no host
    f"redis://repl:{SECRET}@db1/shop",                  # unsupported scheme
    f"postgresql://repl:{SECRET}@db1",                  # no database
    f"host=db1 password={SECRET}",                      # a keyword DSN where a URI is expected
])
def test_uri_errors_never_echo_the_password(raw: str) -> None:
    with pytest.raises(InvalidURI) as exc:
        parse_upstream_uri(raw)
    assert SECRET not in str(exc.value)
    assert SECRET not in exc.value.message


def test_scrub_free_text_and_remembered_passwords() -> None:
    pw = "Pw@with:odd/chars%"
    parse_sink_uri("mysql://app:Pw%40with%3Aodd%2Fchars%25@db2/shop")  # noted by the parser
    text = (f"connect failed for 'mysql://app:Pw%40with%3Aodd%2Fchars%25@db2/shop': Access denied "
            f"(using password: YES) [{pw}] dsn=host=db2 password={SECRET}")
    out = scrub(text)
    assert pw not in out and "Pw%40with" not in out and SECRET not in out, out
    assert "mysql://app:***@db2/shop" in out and "Access denied" in out
    remember_secret("ab")  # too short to be noted: ordinary words stay
    assert scrub("a tab b") == "a tab b"
