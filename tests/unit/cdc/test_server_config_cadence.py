"""ServerConfig: the checkpoint cadence fields and their validation."""

from __future__ import annotations

import pytest

from cdc.config import ServerConfig
from cdc.errors import InvalidConfig

pytestmark = pytest.mark.unit


def test_defaults_and_toml_keys() -> None:
    c = ServerConfig.from_toml("")
    assert (c.checkpoint_min_interval, c.checkpoint_interval, c.owner_flush_interval) == (0.2, 1.0, 0.1)
    c = ServerConfig.from_toml("checkpoint-min-interval = 0.1\ncheckpoint-interval = 0.5\nowner-flush-interval = 0.05\n")
    assert (c.checkpoint_min_interval, c.checkpoint_interval, c.owner_flush_interval) == (0.1, 0.5, 0.05)


@pytest.mark.parametrize("toml", [
    "checkpoint-min-interval = 0\n",
    "checkpoint-min-interval = 2.0\n",  # above checkpoint-interval (1 s)
    "checkpoint-interval = 0.1\n",  # below the default checkpoint-min-interval
    "owner-flush-interval = 0\n",
])
def test_invalid_cadence_is_refused(toml: str) -> None:
    with pytest.raises(InvalidConfig):
        ServerConfig.from_toml(toml)
