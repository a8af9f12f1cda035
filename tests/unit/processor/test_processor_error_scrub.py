"""A span's error is stored in etcd and shown by the API: no password may survive in it (issue 12, item 7)."""

from __future__ import annotations

import pytest

from cdc.errors import SinkUnavailable
from processor.processor import running_error

pytestmark = pytest.mark.unit


def test_span_errors_are_scrubbed() -> None:
    err = running_error(SinkUnavailable("cannot reach mysql://app:Pa@ss-w0rd@db2/shop (host=db2 password=Kw-9x)"),
                         "cap", 0, 1.0)
    assert "Pa@ss-w0rd" not in err.message and "Kw-9x" not in err.message, err.message
    assert "mysql://app:***@db2/shop" in err.message and err.retryable
    other = running_error(RuntimeError("dsn postgresql://u:Zx-s3cret-pw@h/db"), "cap", 1, 1.0)
    assert "Zx-s3cret-pw" not in other.message and other.code == "CDC:ErrInternal"
