"""`/api/v1/log-level` over HTTP against a running node: the levels in force, changed at run
time for the whole process or one logger, and refused with 400 when the level is unknown."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from mop.testing.node import RunningNode, node_settings, running_node

pytestmark = pytest.mark.e2e


@pytest.fixture
def node() -> Iterator[RunningNode]:
    root = logging.getLogger()
    level = root.level
    with running_node(node_settings()) as running:
        yield running
    root.setLevel(level)
    logging.getLogger("mop.mqtt.connections").setLevel(logging.NOTSET)


def call(node: RunningNode, method: str, body: object = None) -> tuple[int, Any]:
    host, port = node.node.address("admin")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{host}:{port}/api/v1/log-level",
        data=data,
        method=method,
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_read_and_change_the_levels(node: RunningNode) -> None:
    logging.getLogger().setLevel(logging.INFO)
    status, levels = call(node, "GET")
    assert status == 200
    assert levels["level"] == "INFO"
    assert isinstance(levels["loggers"], dict)

    status, levels = call(node, "PUT", {"level": "debug"})
    assert (status, levels["level"]) == (200, "DEBUG")
    assert logging.getLogger("mop.anything").isEnabledFor(logging.DEBUG)

    status, levels = call(node, "PUT", {"level": "WARNING", "logger": "mop.mqtt.connections"})
    assert status == 200
    assert levels["loggers"]["mop.mqtt.connections"] == "WARNING"
    assert call(node, "GET")[1] == levels


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"level": "LOUD"}, "unknown log level"),
        ({"level": "NOTSET"}, "unknown log level"),
        ({"level": 10}, "level must be a level's name"),
        ({"level": ""}, "unknown log level"),
        # str.upper() makes INFO of it: no level's name all the same.
        ({"level": "\u0131nfo"}, "level must be a level's name"),
        ({"level": "INFO", "logger": 5}, "logger must be"),
        (["INFO"], "must be an object"),
    ],
)
def test_bad_requests_change_nothing(node: RunningNode, body: object, problem: str) -> None:
    before = call(node, "GET")[1]
    status, answer = call(node, "PUT", body)
    assert status == 400
    assert problem in answer["error"]
    assert call(node, "GET")[1] == before
