"""capture.changefeed_view.consistency_view: what a reader of the target may see, from spans, sink and worker-count."""

import time

import pytest

from capture.changefeed_view import consistency_view, describe
from capture.changefeeds import check_consistency
from cdc.config import ChangefeedConfig
from cdc.errors import InvalidConfig
from cdc.model import ChangefeedInfo, ChangefeedStatus, SpanInfo

pytestmark = pytest.mark.unit


def _info(sink: str, spans: int, config: dict) -> ChangefeedInfo:
    return ChangefeedInfo("cf", "postgresql://u@h/db", sink, config, 1, 0.0, 0.0,
                          spans=tuple(SpanInfo(i, f"s{i}", f"p{i}") for i in range(spans)))


@pytest.mark.parametrize(("sink", "spans", "config", "mode", "workers"), [
    ("postgresql://u@h/t", 1, {}, "transaction", 1),
    ("postgresql://u@h/t", 1, {"sink": {"worker_count": 4}}, "per-key", 4),
    ("mysql://u@h/t", 2, {}, "per-key", 1),
    ("sqlite:///t.db", 1, {"sink": {"worker_count": 4}}, "transaction", 1),  # one writer per file
    ("kafka://h:9092/t?protocol=canal-json", 1, {"sink": {"worker_count": 4}}, "transaction", 1),
    # snapshot mode: the connections each span stages on (one coordinator applies every barrier)
    ("postgresql://u@h/t", 3, {"sink": {"worker_count": 4}, "consistency": {"mode": "snapshot"}}, "snapshot", 4),
    ("sqlite:///t.db", 3, {"sink": {"worker_count": 4}, "consistency": {"mode": "snapshot"}}, "snapshot", 1),
])
def test_mode_follows_spans_and_apply_workers(sink: str, spans: int, config: dict, mode: str, workers: int) -> None:
    c = consistency_view(_info(sink, spans, config))
    assert (c["mode"], c["spans"], c["apply_workers"]) == (mode, spans, workers)
    if mode == "per-key":
        assert "later transaction may become visible" in c["detail"]


def test_the_changefeed_view_carries_it() -> None:
    view = describe(_info("postgresql://u@h/t", 3, {"sink": {"worker_count": 2}}), None, {}, {})
    assert view["consistency"]["mode"] == "per-key"
    assert "3 spans and 2 apply workers" in view["consistency"]["detail"]


def test_snapshot_mode_is_shown_with_its_interval_and_syncpoint() -> None:
    c = consistency_view(_info("postgresql://u@h/t", 3, {"consistency": {"mode": "snapshot", "interval": 2.5,
                                                                         "syncpoint": True}}))
    assert (c["mode"], c["spans"], c["interval"], c["syncpoint"]) == ("snapshot", 3, 2.5, True)
    assert "tidewater_syncpoint" in c["detail"]


@pytest.mark.parametrize("sink", ["kafka://h:9092/t?protocol=canal-json", "file:///tmp/x?protocol=csv",
                                  "blackhole://"])
def test_snapshot_mode_is_refused_for_sinks_that_cannot_apply_barriers(sink: str) -> None:
    config = ChangefeedConfig.from_toml('[consistency]\nmode = "snapshot"\n')
    with pytest.raises(InvalidConfig, match="not available for"):
        check_consistency(config, sink)
    check_consistency(ChangefeedConfig(), sink)  # the default mode: any sink
    for sql in ("postgresql://u@h/t", "mysql://u@h/t", "sqlite:///t.db"):
        check_consistency(config, sql)


def test_snapshot_mode_shows_the_barrier_readers_see() -> None:
    info = _info("postgresql://u@h/t", 3, {"consistency": {"mode": "snapshot"}})
    view = describe(info, ChangefeedStatus(checkpoint_ts=500), {}, {})["consistency"]
    assert (view["barrier_ts"], view["barrier"], view["barrier_lag"]) == (None, None, None)  # none applied yet
    status = ChangefeedStatus(checkpoint_ts=0x3000020, barrier_ts=0x3000010, barrier_time=time.time() - 2)
    view = describe(info, status, {}, {})["consistency"]
    assert view["barrier_ts"] == 0x3000010 and view["barrier"] == "0/3000010"
    assert 1.5 < view["barrier_lag"] < 10
    assert "barrier_ts" not in describe(_info("postgresql://u@h/t", 3, {}), status, {}, {})["consistency"]
