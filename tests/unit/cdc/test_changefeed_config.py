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


@pytest.mark.parametrize(("toml", "named"), [
    ("span-count = 0", "span-count"),
    ("span-count = 65", "span-count"),
    ("memory-quota = 1000", "memory-quota"),
    ("[sink]\nbatch-rows = 0", "batch-rows"),
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
