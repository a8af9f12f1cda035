"""Tidewater's benchmark (``python -m bench``, ``make bench``): throughput, lag, CPU and memory of one
``cdc server``, measured side by side with references on the same data in the same run.

Modules: :mod:`bench.cli` (command line), :mod:`bench.runner` (orchestration), :mod:`bench.env`
(servers), :mod:`bench.workloads` (what is written upstream), :mod:`bench.consumers` (Tidewater,
``pg_recvlogical``, native logical replication), :mod:`bench.ceiling` (bulk loads into the targets),
:mod:`bench.lag` (lag under a fixed offered rate), :mod:`bench.bigtxn` (the 1 GB transaction, through
``scripts/bench_big_txn.py``), :mod:`bench.procstat` (CPU and RSS from ``/proc``), :mod:`bench.profile`
(py-spy), :mod:`bench.report` (result tables). See ``docs/benchmarks.md``.
"""
