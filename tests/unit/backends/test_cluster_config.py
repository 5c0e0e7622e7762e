"""The separated-mode settings (`[cluster]`) load from the environment with their rules."""

from __future__ import annotations

import pytest

from mop.config import ConfigError, load_settings
from mop.settings import ClusterSettings


def test_cluster_keys_from_the_environment() -> None:
    settings = load_settings(
        environ={
            "MOP_MODE": "separated",
            "MOP_CLUSTER__SERVICE_URL": "pulsar://10.0.0.1:6650,10.0.0.2:6650",
            "MOP_CLUSTER__PATTERN_DISCOVERY": "2",
            "MOP_CLUSTER__OPERATION_TIMEOUT": "5",
            "MOP_CLUSTER__BATCHING_DELAY": "0",
            "MOP_CLUSTER__RECEIVER_QUEUE": "100",
        }
    )
    assert settings.cluster == ClusterSettings(
        service_url="pulsar://10.0.0.1:6650,10.0.0.2:6650",
        pattern_discovery=2,
        operation_timeout=5.0,
        batching_delay=0.0,
        receiver_queue=100,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PATTERN_DISCOVERY", "0"),
        ("OPERATION_TIMEOUT", "0"),
        ("FENCE_TIMEOUT", "-1"),
        ("BATCHING_DELAY", "-0.5"),
        ("RECEIVER_QUEUE", "0"),
    ],
)
def test_cluster_values_are_checked(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"cluster.{name.lower()}"):
        load_settings(environ={f"MOP_CLUSTER__{name}": value})
