"""tidewater_data_warnings: one gauge series per (changefeed, code, table, severity), from the stored
ChangefeedStatus.warnings, exported by the owner; series of a removed changefeed disappear."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capture.metrics import CaptureCollector, make_registry
from cdc.meta.store import ClusterSnapshot, Versioned
from cdc.model import ChangefeedInfo, ChangefeedStatus, DataWarning, FeedState, WarningSeverity

pytestmark = pytest.mark.unit


def _info(cf: str, state: FeedState = FeedState.WARNING) -> ChangefeedInfo:
    return ChangefeedInfo(id=cf, upstream_uri="postgresql://u@h/db", sink_uri="blackhole://", config={},
                          start_ts=1, start_time=1.0, create_time=1.0, state=state)


def _scrape(snap: ClusterSnapshot, is_owner: bool = True) -> dict[tuple[str, str, str, str], float]:
    text = make_registry(CaptureCollector("cap", lambda: is_owner, lambda: snap, lambda: [], lambda: 0))()
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            if s.name == "tidewater_data_warnings":
                out[(s.labels["changefeed"], s.labels["code"], s.labels["table"], s.labels["severity"])] = s.value
    return out


def test_owner_exports_one_series_per_warning_and_drops_removed_changefeeds() -> None:
    rows = DataWarning("CDC:WarnUnreplicatedRows", "public.late", "m", WarningSeverity.DIVERGENCE, 42)
    miss = DataWarning("CDC:WarnMissingRow", "public.t", "m", WarningSeverity.NOTICE, 3, ("1",))
    snap = ClusterSnapshot(revision=1, changefeeds={"a": Versioned(_info("a"), 1), "b": Versioned(_info("b"), 1)},
                           statuses={"a": ChangefeedStatus(warnings=(rows, miss)), "b": ChangefeedStatus()})
    assert _scrape(snap) == {("a", "CDC:WarnUnreplicatedRows", "public.late", "divergence"): 42.0,
                             ("a", "CDC:WarnMissingRow", "public.t", "notice"): 3.0}
    assert _scrape(snap, is_owner=False) == {}
    del snap.changefeeds["a"], snap.statuses["a"]
    assert _scrape(snap) == {}
