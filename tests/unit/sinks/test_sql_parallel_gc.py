"""sinks.sql.ops.parallel.collector_paused: the cyclic collector is off while any write holds it, on again after the
last one, and left off when it was off before."""

from __future__ import annotations

import gc

from sinks.sql.ops.parallel import collector_paused


def test_nested_writes_keep_the_collector_off_until_the_last() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_enables_it_again_and_a_disabled_collector_stays_disabled() -> None:
    try:
        with collector_paused():
            raise ValueError("x")
    except ValueError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
