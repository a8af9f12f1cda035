"""``python -m bench --worker-count N``: the changefeeds' ``[sink] worker-count``, merged into any changefeed TOML."""

from __future__ import annotations

from bench.cli import with_worker_count
from cdc.config import ChangefeedConfig


def test_worker_count_option_sets_the_sink_table() -> None:
    assert with_worker_count("x = 1\n", None) == "x = 1\n"
    for base in ("", "span-count = 2", "[sink]\nbatch-rows = 5\n[ddl]\nmode = \"apply\"\n"):
        cfg = ChangefeedConfig.from_toml(with_worker_count(base, 4))
        assert cfg.sink.worker_count == 4
    assert ChangefeedConfig.from_toml(with_worker_count("[sink]\nbatch-rows = 5\n", 2)).sink.batch_rows == 5
