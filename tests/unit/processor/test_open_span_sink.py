"""processor.processor.open_span_sink: a snapshot-mode changefeed's span stages its writes, and a sink that cannot is
a loud error, never a direct apply."""

from __future__ import annotations

import pytest

from cdc.config import ChangefeedConfig
from cdc.errors import SinkError
from processor.processor import open_span_sink
from sinks.testing import MemoryBarrierSink, MemorySink, MemorySinks

pytestmark = pytest.mark.unit

SNAPSHOT = ChangefeedConfig.from_toml('[consistency]\nmode = "snapshot"\n')


def test_snapshot_mode_stages() -> None:
    sink = open_span_sink(MemorySinks(MemoryBarrierSink), "postgresql://u@h/t", SNAPSHOT)
    assert isinstance(sink, MemoryBarrierSink) and sink.staging
    plain = open_span_sink(MemorySinks(MemoryBarrierSink), "postgresql://u@h/t", ChangefeedConfig())
    assert isinstance(plain, MemoryBarrierSink) and not plain.staging


def test_a_sink_without_barriers_fails_the_span() -> None:
    sinks = MemorySinks(MemorySink)
    with pytest.raises(SinkError, match="cannot apply whole barriers"):
        open_span_sink(sinks, "kafka://h/t", SNAPSHOT)
    assert sinks.opened[0].closed  # type: ignore[attr-defined]
    assert not isinstance(open_span_sink(sinks, "kafka://h/t", ChangefeedConfig()), MemoryBarrierSink)
