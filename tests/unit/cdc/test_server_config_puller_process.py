"""ServerConfig ``puller-process`` and the error rebuilt from a code (both used by processor.source_process)."""

from __future__ import annotations

import pytest

from cdc.config import ServerConfig
from cdc.errors import DdlRejected, InvalidConfig, error_for_code

pytestmark = pytest.mark.unit


def test_puller_process_is_a_boolean_key() -> None:
    assert ServerConfig.from_toml("").puller_process is False
    assert ServerConfig.from_toml("puller-process = true\n").puller_process is True
    for bad in ('puller-process = "yes"\n', "puller-process = 1\n"):
        with pytest.raises(InvalidConfig, match="puller-process"):
            ServerConfig.from_toml(bad)


def test_an_error_whose_init_takes_other_arguments_is_rebuilt_from_its_code() -> None:
    err = error_for_code(DdlRejected.code, "DDL 'ALTER x' on table t cannot be applied: no")
    assert type(err) is DdlRejected and err.message.endswith("cannot be applied: no") and not err.retryable
