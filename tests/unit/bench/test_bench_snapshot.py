"""bench.snapshot without servers: the copy's changefeed config, the report's tables, and the CPU of a process
tree whose processes come and go (bench.procstat.TreeCpu, on real processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.procstat import TreeCpu
from bench.snapshot import CopyRun, SnapshotReport, changefeed_config, format_snapshot

pytestmark = pytest.mark.unit


def test_the_copy_always_runs_in_spark_unless_the_given_config_says_otherwise() -> None:
    assert changefeed_config("", None, None) == '[snapshot]\nmode = "initial"\nspark-min-rows = 0\n'
    cfg = changefeed_config("span-count = 2\n", 50000, "local[2]")
    assert cfg.startswith("span-count = 2\n\n[snapshot]\n") and "chunk-rows = 50000" in cfg
    assert 'spark-master = "local[2]"' in cfg
    own = '[snapshot]\nmode = "initial"\nchunk-rows = 7\n'
    assert changefeed_config(own, 50000, None) == own


def _table(text: str, header: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(header))
    cols = [c.strip() for c in lines[i].strip("|").split("|")]
    out = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        out.append(dict(zip(cols, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return out


def test_the_report_puts_each_sink_next_to_the_references_of_the_same_run() -> None:
    rep = SnapshotReport(1000, 4, load_seconds=1.0, config='[snapshot]\nmode = "initial"\n')
    rep.runs = [CopyRun("dump_data", "postgresql", "pg_dump --data-only | psql", 1000, seconds=2.0, server_cpu_s=1.0),
                CopyRun("dump", "postgresql", "pg_dump | psql", 1000, seconds=1.0),
                CopyRun("tidewater", "postgresql", "Tidewater -> postgresql", 1000, seconds=4.0, client_cpu_s=2.0,
                        server_cpu_s=3.0, rss_peak=800 << 20, first_chunk_s=1.5, verified="row by row"),
                CopyRun("ceiling", "postgresql", "write ceiling postgresql (COPY)", 1000, seconds=0.5),
                CopyRun("tidewater", "sqlite", "Tidewater -> sqlite", 1000, error="TimeoutError: still copying")]
    text = format_snapshot(rep)
    pg, lite = _table(text, "| sink | rows |")
    assert pg["Tidewater rows/s"] == "250" and pg["TW/dump data-only"] == "0.50" and pg["TW/dump+restore"] == "0.25"
    assert pg["TW/write"] == "0.12" and pg["tree peak RSS MB"] == "800" and pg["verified"] == "row by row"
    assert pg["capture tree CPU s/M rows"] == "2000.0" and pg["first chunk s"] == "1.5"
    assert lite["Tidewater rows/s"] == "-" and lite["verified"].startswith("TimeoutError")
    details = _table(text, "| what | sink |")
    assert [d["what"] for d in details][:2] == ["pg_dump --data-only into psql", "pg_dump into psql"]


def test_tree_cpu_counts_children_that_exited_and_nothing_before_the_start() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    before = subprocess.Popen([sys.executable, "-c", burn])
    before.wait()  # reaped before the start: not counted
    cpu = TreeCpu([os.getpid()], interval=0.02).start()
    child = subprocess.Popen([sys.executable, "-c", burn + "time.sleep(0.2)\n"])  # ends idle: its last reading holds
    child.wait()
    used = cpu.stop()
    assert 0.25 <= used < 1.5, used
