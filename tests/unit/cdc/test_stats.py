"""cdc.stats: the histogram's Prometheus semantics (le inclusive, cumulative, +Inf) and counters."""

from __future__ import annotations

import pytest

from cdc.stats import Histogram, SpanStats

pytestmark = pytest.mark.unit


def test_histogram_buckets_are_inclusive_and_cumulative() -> None:
    h = Histogram((0.1, 1.0, 10.0))
    for v in (0.05, 0.1, 0.5, 1.0, 20.0):
        h.observe(v)
    assert h.cumulative() == [("0.1", 2), ("1.0", 4), ("10.0", 4), ("+Inf", 5)]
    assert h.count == 5 and abs(h.sum - 21.65) < 1e-9


def test_histogram_rejects_unsorted_buckets() -> None:
    with pytest.raises(ValueError):
        Histogram((1.0, 0.5))


def test_span_stats_failure_and_restart() -> None:
    st = SpanStats()
    st.failed("sink", "CDC:ErrSinkUnavailable", 100.0, 1)
    st.failed("sink", "CDC:ErrSinkUnavailable", 200.0, 2)
    assert st.errors == {("sink", "CDC:ErrSinkUnavailable"): 2} and st.restart_at == 200.0
    st.started(after_failure=True)
    st.started(after_failure=False)
    assert st.restarts == 1 and st.restart_at == 0.0
