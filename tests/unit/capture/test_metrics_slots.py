"""tidewater_slot_* families from the owner's upstream reports."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capture.metrics import CaptureCollector, make_registry
from cdc.meta.store import ClusterSnapshot
from owner.upstream_watch import SlotReport, UpstreamReport

pytestmark = pytest.mark.unit


def _samples(text: bytes, name: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            if s.name == name:
                out[(s.labels["changefeed"], s.labels["span"], s.labels["slot"])] = s.value
    return out


def _scrape(is_owner: bool, reports: list[UpstreamReport]) -> bytes:
    collector = CaptureCollector("cap", lambda: is_owner, lambda: ClusterSnapshot(revision=1), lambda: [],
                                 lambda: 0, slot_reports=lambda: reports)
    return make_registry(collector)()


def _reports() -> list[UpstreamReport]:
    ok = SlotReport(0, "slot_a0", True, True, 123456, 99, "reserved", False, "pub_a0")
    gone = SlotReport(1, "slot_a1", False, False, None, None, None, False, "pub_a1")
    lost = SlotReport(0, "slot_b0", True, False, None, None, "lost", True, "pub_b0", True, "wal_removed")
    return [UpstreamReport("a", 1.0, (ok, gone)), UpstreamReport("b", 1.0, (lost,)),
            UpstreamReport("c", 1.0, (), error="unreachable")]


def test_owner_exports_retained_wal_per_slot() -> None:
    text = _scrape(True, _reports())
    assert _samples(text, "tidewater_slot_retained_wal_bytes") == {("a", "0", "slot_a0"): 123456.0}
    assert _samples(text, "tidewater_slot_usable") == {
        ("a", "0", "slot_a0"): 1.0, ("a", "1", "slot_a1"): 0.0, ("b", "0", "slot_b0"): 0.0}


def test_non_owner_exports_no_slot_series() -> None:
    text = _scrape(False, _reports())
    assert _samples(text, "tidewater_slot_retained_wal_bytes") == {}
    assert _samples(text, "tidewater_slot_usable") == {}


def test_collector_default_has_no_slot_reports() -> None:
    collector: Any = CaptureCollector("cap", lambda: True, lambda: ClusterSnapshot(revision=1), lambda: [],
                                      lambda: 0)
    text = make_registry(collector)()
    assert b"tidewater_slot_retained_wal_bytes" in text  # family present (HELP/TYPE), no samples
    assert _samples(text, "tidewater_slot_retained_wal_bytes") == {}
