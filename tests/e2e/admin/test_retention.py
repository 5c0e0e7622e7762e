"""Retention policies through Pulsar's admin REST API on a merged node: the policy in force,
a run-time override that applies at once and outlives a restart, and its removal."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mop.settings import StorageSettings
from mop.testing.node import RunningNode, node_settings, running_node
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.admin.api import Api
from tests.e2e.clients import Client

pytestmark = pytest.mark.e2e

PATH = "/admin/v2/namespaces/public/default/retention"
DEFAULT = {"retentionTimeInMinutes": 1440, "retentionSizeInMB": 256}


def stored(node: RunningNode, topic: str) -> int:
    storage = node.node.processor.backend.storage  # type: ignore[attr-defined]

    def count() -> int:
        index = storage.index.topics.get(topic)
        return 0 if index is None else int(index.count)

    return node.call(count)


def test_retention_is_read_set_and_removed_at_run_time(tmp_path: Path) -> None:
    settings = node_settings(
        data_dir=str(tmp_path / "data"), storage=StorageSettings(unsubscribed_grace=0)
    )
    topic = mqtt_to_pulsar("kept/reading")
    with running_node(settings) as node:
        api = Api(node)
        assert api.get(PATH) == DEFAULT
        publisher = Client(node.mqtt_port, "kept-pub")
        assert publisher.publish("kept/reading", b"r0", 1) in (0, 0x10)
        time.sleep(1.5)  # a trimming pass or more: the default policy keeps it
        assert stored(node, topic) == 1
        answer = api.call("POST", PATH, {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
        assert answer.status == 204, answer.body
        assert api.get(PATH) == {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
        deadline = time.monotonic() + 10
        while stored(node, topic):
            assert time.monotonic() < deadline, "the override did not apply"
            time.sleep(0.1)
        publisher.disconnect()
    with running_node(settings) as node:
        api = Api(node)
        assert api.get(PATH) == {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
        assert api.call("DELETE", PATH).status == 204
        assert api.get(PATH) == DEFAULT
        # Another namespace was never overridden.
        assert api.get("/admin/v2/namespaces/public/other/retention") == DEFAULT


def test_policies_that_are_not_valid_are_refused(tmp_path: Path) -> None:
    with running_node(node_settings(data_dir=str(tmp_path / "data"))) as node:
        api = Api(node)
        for body in (
            {"retentionTimeInMinutes": -2, "retentionSizeInMB": 0},
            {"retentionTimeInMinutes": 10},
            {"retentionTimeInMinutes": "10", "retentionSizeInMB": 1},
            [],
        ):
            answer = api.call("POST", PATH, body)
            assert answer.status == 400, (body, answer.body)
            assert "reason" in answer.json()
        assert api.call("GET", "/admin/v2/namespaces/pub%20lic/default/retention").status == 412
        assert api.get(PATH) == DEFAULT


def test_policies_are_checked_against_each_other_as_pulsar_checks_them(tmp_path: Path) -> None:
    quota_path = "/admin/v2/namespaces/public/default/backlogQuota"
    with running_node(node_settings(data_dir=str(tmp_path / "data"))) as node:
        api = Api(node)
        # A single 0 limit with the other nonzero is refused, as by Pulsar.
        for body in (
            {"retentionTimeInMinutes": 0, "retentionSizeInMB": 10},
            {"retentionTimeInMinutes": 10, "retentionSizeInMB": 0},
        ):
            answer = api.call("POST", PATH, body)
            assert answer.status == 400, (body, answer.body)
            assert "Setting a single time or size limit to 0" in answer.json()["reason"]
        # A size quota must stay below the retention size (256 MiB by default here).
        answer = api.call(
            "POST", quota_path, {"limitSize": 256 << 20, "policy": "producer_exception"}
        )
        assert answer.status == 412, answer.body
        assert "Backlog Quota exceeds configured retention quota" in answer.json()["reason"]
        assert api.call("POST", quota_path, {"limitSize": 100 << 20}).status == 204
        answer = api.call("POST", PATH, {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100})
        assert answer.status == 412, answer.body
        assert "Retention Quota must exceed configured backlog quota" in answer.json()["reason"]
        assert api.get(PATH) == DEFAULT
        assert (
            api.call("POST", PATH, {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}).status
            == 204
        )
        # The system namespace's policies are fixed.
        system = "/admin/v2/namespaces/public/__mop"
        answer = api.call(
            "POST", f"{system}/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
        )
        assert answer.status == 412, answer.body
        assert api.call("POST", f"{system}/backlogQuota", {"limitSize": 1}).status == 412
        assert api.call("DELETE", f"{system}/retention").status == 412
