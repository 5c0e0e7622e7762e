"""Helpers of the admin API's topic tests: plain HTTP to a node's admin listener (httpx's
blocking client) and bounded waits for numbers that follow the clients."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from mop.testing.node import RunningNode

T = TypeVar("T")
WAIT = 15.0


def admin_url(node: RunningNode) -> str:
    host, port = node.node.address("admin")
    return f"http://{host}:{port}"


def topic_url(topic: str) -> str:
    """`/api/v1/topics/{topic}` for an MQTT name or a full Pulsar name."""
    return "/api/v1/topics/" + quote(topic, safe="")


def eventually(probe: Callable[[], T], accept: Callable[[T], bool], wait: float = WAIT) -> T:
    """`probe()` again and again until `accept` takes what it returned (at most `wait` s)."""
    deadline = time.monotonic() + wait
    while True:
        value = probe()
        if accept(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def stats(http: httpx.Client, topic: str) -> Any:
    answer = http.get(topic_url(topic))
    return answer.json() if answer.status_code == 200 else {"status": answer.status_code}


def subscription(detail: Any, name: str) -> Any:
    for sub in detail.get("subscriptions_detail", ()):
        if sub["name"] == name:
            return sub
    return None
