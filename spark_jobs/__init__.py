"""Bulk jobs that run on Spark (PySpark), each as its own process (DESIGN.md section 5).

- :mod:`spark_jobs.snapshot`: the initial snapshot copy (``python -m spark_jobs.snapshot --plan FILE``).
- :mod:`spark_jobs.plan`: the job's input (:class:`~spark_jobs.plan.SnapshotJob`, a JSON file).
- :mod:`spark_jobs.copy`: what one Spark task does with its chunks (no Spark import: testable alone).
- :mod:`spark_jobs.session`: the SparkSession every job uses (master from the plan, our interpreter).
- :mod:`spark_jobs.datasource`: a PySpark Python Data Source whose partitions are snapshot chunks.
- :mod:`spark_jobs.verify`: ``changefeed verify``'s comparison job (chunk checksums, then drill-down);
  :mod:`spark_jobs.verify_chunk` what one of its tasks does, :mod:`spark_jobs.verify_values` the canonical forms.

Only ``capture`` (which launches the jobs) and ``playground`` import this package; it reaches the upstream only
through ``upstream.base``/``open_upstream`` and never imports ``capture``, ``owner`` or ``processor``.
"""
