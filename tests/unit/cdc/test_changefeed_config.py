"""The changefeed TOML: defaults, dashes, validation with a message naming the key."""

import pytest

from cdc.config import ChangefeedConfig
from cdc.errors import InvalidConfig

pytestmark = pytest.mark.unit


def test_defaults_and_dashed_keys() -> None:
    assert ChangefeedConfig.from_toml("") == ChangefeedConfig()
    cfg = ChangefeedConfig.from_toml('span-count = 4\nmemory-quota = 67108864\n[sink]\nbatch-rows = 10\n'
                                     '[filter]\nrules = ["public.*"]\n')
    assert (cfg.span_count, cfg.memory_quota, cfg.sink.batch_rows, cfg.filter.rules) == (4, 64 << 20, 10, ("public.*",))
    assert ChangefeedConfig.from_dict(cfg.to_dict()) == cfg
    assert (cfg.sink.delivery, cfg.sink.checkpoint_table) == ("exactly-once", "tidewater_checkpoint")
    cfg = ChangefeedConfig.from_toml('[sink]\ndelivery = "at-least-once"\ncheckpoint-table = "cdc_pos"\n')
    assert (cfg.sink.delivery, cfg.sink.checkpoint_table) == ("at-least-once", "cdc_pos")
    assert ChangefeedConfig().sink.worker_count == 1
    assert ChangefeedConfig.from_toml("[sink]\nworker-count = 4\n").sink.worker_count == 4


@pytest.mark.parametrize(("toml", "named"), [
    ("span-count = 0", "span-count"),
    ("span-count = 65", "span-count"),
    ("memory-quota = 1000", "memory-quota"),
    ("[sink]\nbatch-rows = 0", "batch-rows"),
    ("[sink]\nworker-count = 0", "sink.worker-count"),
    ("[sink]\nworker-count = 9", "sink.worker-count"),
    ('[sink]\nworker-count = "4"', "sink.worker-count"),
    ("[filter]\nrules = []", "filter.rules"),
    ('[sink]\ndelivery = "exactly-twice"', "sink.delivery"),
    ('[sink]\ncheckpoint-table = "x; DROP TABLE y"', "sink.checkpoint-table"),
    ("memroy-quota = 5", "memroy-quota"),
])
def test_invalid_values_name_the_key(toml: str, named: str) -> None:
    with pytest.raises(InvalidConfig, match=named):
        ChangefeedConfig.from_toml(toml)


def test_the_api_type_check_accepts_booleans_and_integer_arrays_where_the_config_has_them() -> None:
    from capture.changefeeds import load_config

    cfg = load_config("[ddl]\nreplicate-indexes = true\nskip-ts = [123, 456]\non-error = \"skip\"\n")
    assert (cfg.ddl.replicate_indexes, cfg.ddl.skip_ts, cfg.ddl.on_error) == (True, (123, 456), "skip")
    for bad, named in [("[ddl]\nreplicate-indexes = 1", "true or false"), ("[ddl]\nskip-ts = ['1']", "integers"),
                       ("[ddl]\nskip-ts = [true]", "integers"), ("span-count = true", "an integer"),
                       ("[filter]\nrules = [1]", "strings")]:
        with pytest.raises(InvalidConfig, match=named):
            load_config(bad)


def test_the_snapshot_defaults_are_one_constant_shared_with_the_job() -> None:
    from cdc.config import DEFAULT_CHUNK_ROWS, SnapshotConfig
    from spark_jobs import plan

    snap = ChangefeedConfig.from_toml("").snapshot
    assert snap == SnapshotConfig()
    assert (snap.mode, snap.on_existing_rows, snap.chunk_rows, snap.spark_master, snap.spark_min_rows) == (
        "initial", "refuse", 100_000, "local[*]", 20_000)
    assert DEFAULT_CHUNK_ROWS == 100_000  # docs/snapshot.md's option table and docs/benchmarks.md say why
    assert plan.DEFAULT_CHUNK_ROWS is DEFAULT_CHUNK_ROWS  # the job's default is the changefeed's, not a copy
    job = plan.SnapshotJob(changefeed="cf", upstream="postgresql://u@h/db", sink="sqlite:///t.db", tables=("public.t",),
                           etcd=("http://127.0.0.1:2379",))
    assert (job.chunk_rows, job.spark_master) == (snap.chunk_rows, snap.spark_master)


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2]", "local[4,2]", "yarn", "spark://h:7077",
                                    "spark://a:7077,b:7077", "k8s://https://h:6443"])
def test_spark_master_urls_spark_takes_are_accepted(master: str) -> None:
    cfg = ChangefeedConfig.from_toml(f'[snapshot]\nspark-master = "{master}"\n')
    assert cfg.snapshot.spark_master == master


@pytest.mark.parametrize(("toml", "named", "fix"), [
    ('[snapshot]\nmode = "full"', "snapshot.mode", '"initial" or "none"'),
    ('[snapshot]\nmode = ""', "snapshot.mode", '"initial" or "none"'),
    ("[snapshot]\nchunk-rows = 0", "snapshot.chunk-rows", "positive"),
    ("[snapshot]\nchunk-rows = -5", "snapshot.chunk-rows", "positive"),
    ('[snapshot]\non-existing-rows = "overwrite"', "snapshot.on-existing-rows", "refuse, truncate, merge"),
    ('[snapshot]\nspark-master = "mesos://h:5050"', "snapshot.spark-master", "spark://host:port"),
    ('[snapshot]\nspark-master = "http://h:8080"', "snapshot.spark-master", "local[*]"),
    ('[snapshot]\nspark-master = "local[0]"', "snapshot.spark-master", "local[N]"),
    ('[snapshot]\nspark-master = ""', "snapshot.spark-master", "local[*]"),
    ('[snapshot]\nspark-master = "spark:/h:7077"', "snapshot.spark-master", "spark://host:port"),
    ("[snapshot]\nspark-min-rows = -1", "snapshot.spark-min-rows", ">= 0"),
    ("[snapshot]\nchunk-size = 10", "chunk-size", "snapshot"),
])
def test_a_bad_snapshot_option_is_refused_at_load_naming_it(toml: str, named: str, fix: str) -> None:
    with pytest.raises(InvalidConfig) as refused:
        ChangefeedConfig.from_toml(toml)
    assert named in refused.value.message and fix in refused.value.message, refused.value.message


def test_a_bad_snapshot_option_is_refused_by_the_api_loader_too() -> None:
    from capture.changefeeds import load_config

    with pytest.raises(InvalidConfig, match="snapshot.chunk-rows"):
        load_config("[snapshot]\nchunk-rows = 0\n")
    with pytest.raises(InvalidConfig, match="snapshot.spark-master"):
        load_config('[snapshot]\nspark-master = "mesos://h:5050"\n')


def test_consistency_section() -> None:
    assert ChangefeedConfig().consistency.mode == "default"
    cfg = ChangefeedConfig.from_toml('[consistency]\nmode = "snapshot"\ninterval = 2\nsyncpoint = true\n')
    assert (cfg.consistency.mode, cfg.consistency.interval, cfg.consistency.syncpoint) == ("snapshot", 2.0, True)
    assert cfg.consistency.snapshot
    assert ChangefeedConfig.from_dict(cfg.to_dict()) == cfg
    assert ChangefeedConfig.from_dict({}).consistency == ChangefeedConfig().consistency  # stored by older versions


def test_snapshot_mode_takes_several_apply_workers() -> None:
    """Snapshot mode stages a span's write on worker-count connections (sinks.sql.ops.barrier, issue 25 item 4)."""
    cfg = ChangefeedConfig.from_toml('[consistency]\nmode = "snapshot"\n[sink]\nworker-count = 4')
    assert (cfg.consistency.snapshot, cfg.sink.worker_count) == (True, 4)


@pytest.mark.parametrize(("toml", "named"), [
    ('[consistency]\nmode = "strict"', "consistency.mode"),
    ('[consistency]\nmode = "snapshot"\ninterval = 0', "consistency.interval"),
    ('[consistency]\nmode = "snapshot"\ninterval = "1s"', "consistency.interval"),
    ("[consistency]\nsyncpoint = true", "consistency.syncpoint"),  # default mode: refused, pointing to snapshot mode
    ('[consistency]\nmode = "snapshot"\nsyncpoint = 1', "consistency.syncpoint"),
    ('[consistency]\nmode = "snapshot"\n[sink]\ndelivery = "at-least-once"', "exactly-once"),
    ('[consistency]\nmode = "snapshot"\n[sink]\nworker-count = 9', "worker-count"),  # the sink's own bound
    ('[consistency]\nmod = "snapshot"', "mod"),
])
def test_invalid_consistency_names_the_key(toml: str, named: str) -> None:
    with pytest.raises(InvalidConfig, match=named):
        ChangefeedConfig.from_toml(toml)
