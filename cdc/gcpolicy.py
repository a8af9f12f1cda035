"""Python's cyclic garbage collector in Tidewater's long-running processes (a capture, a span source's child).

CPython runs a generation-0 collection every 700 net container allocations. A capture streaming transactions
allocates containers that live until the sink has written them (changes, batches, watermarks), so young
collections run thousands of times per second of catch-up and each promotes survivors that later older
collections scan again, together with every object of the imported modules: ~10 % of a span's CPU per
transaction (docs/benchmarks.md, branch pgtxn). :func:`tune_for_streaming` collects once, freezes what exists
(the imported modules and start-up objects are never scanned again) and raises the generation-0 threshold to
:data:`GEN0_THRESHOLD`. Memory is unchanged in practice: objects are freed by reference counting; only cyclic
garbage waits for the larger threshold (at most that many containers).

``TIDEWATER_GC=default`` in the environment keeps CPython's settings (for measuring the difference).
"""

from __future__ import annotations

import gc
import os

GEN0_THRESHOLD = 50_000


def tune_for_streaming() -> bool:
    """Freeze the objects alive now and raise the generation-0 threshold; False (nothing done) when
    ``TIDEWATER_GC=default``. Call once, after the process's imports."""
    if os.environ.get("TIDEWATER_GC", "").strip().lower() == "default":
        return False
    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    return True
