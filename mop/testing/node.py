"""Run a real mop node in a background thread, for tests that drive it with blocking clients.

    with running_node(settings) as node:
        client.connect("127.0.0.1", node.mqtt_port)

The node runs its own trio loop in the thread and is stopped (cleanly, like Ctrl-C) on exit.
`as_proxy(settings, service_url)` makes the node a separated-mode proxy in front of brokers.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import trio

from mop.node import Node, open_node
from mop.settings import (
    AdminSettings,
    GrpcSettings,
    LimitsSettings,
    MqttSettings,
    Settings,
    StorageSettings,
)

T = TypeVar("T")


# Data directories made by `node_settings`, removed again when their node stops.
_TEMPORARY_DIRS: set[str] = set()


def node_settings(
    *,
    data_dir: str | None = None,
    storage: StorageSettings | None = None,
    limits: LimitsSettings | None = None,
    **mqtt: Any,
) -> Settings:
    """Settings for a throw-away merged node on free loopback ports (MQTT and the admin API;
    gRPC too once added to `protocols`), with its data in a fresh temporary directory unless
    `data_dir` is given."""
    mqtt.setdefault("port", 0)
    mqtt.setdefault("sys_interval", 0)
    if data_dir is None:
        data_dir = tempfile.mkdtemp(prefix="mop-node-")
        _TEMPORARY_DIRS.add(data_dir)
    return Settings(
        protocols=("mqtt",),
        data_dir=data_dir,
        mqtt=dataclasses.replace(MqttSettings(), **mqtt),
        storage=storage or StorageSettings(),
        limits=limits or LimitsSettings(),
        admin=AdminSettings(port=0),
        grpc=GrpcSettings(port=0, tls_port=0),
    )


def as_proxy(settings: Settings, service_url: str, *, namespace: str | None = None) -> Settings:
    """`settings` (of a merged node, e.g. from `node_settings`) turned into those of a
    separated-mode proxy (MQTT only) in front of the brokers at `service_url`, everything else
    kept. `namespace` becomes the default namespace, so that proxies sharing brokers (tests
    side by side on one broker, say) keep their topics apart."""
    return dataclasses.replace(
        settings,
        mode="separated",
        protocols=("mqtt",),
        default_namespace=namespace or settings.default_namespace,
        cluster=dataclasses.replace(settings.cluster, service_url=service_url),
    )


class RunningNode:
    def __init__(self, node: Node, token: trio.lowlevel.TrioToken) -> None:
        self.node = node
        self._token = token

    @property
    def mqtt_port(self) -> int:
        return self.node.address("mqtt", "tcp")[1]

    def port(self, kind: str) -> int:
        return self.node.address("mqtt", kind)[1]

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the node's trio thread and return its result (to inspect state)."""
        return trio.from_thread.run_sync(fn, trio_token=self._token)

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Await `fn()` on the node's trio thread and return its result."""
        return trio.from_thread.run(fn, trio_token=self._token)


@contextmanager
def running_node(settings: Settings | None = None, *, timeout: float = 30) -> Iterator[RunningNode]:
    settings = settings or node_settings()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with open_node(settings) as node:
            stop = trio.Event()
            box["running"] = RunningNode(node, trio.lowlevel.current_trio_token())
            box["stop"] = stop
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # reported to the test thread below
            box["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="mop-node", daemon=True)
    thread.start()
    if not ready.wait(timeout) or "running" not in box:
        thread.join(timeout)
        raise RuntimeError(f"node did not start: {box.get('error')!r}")
    running: RunningNode = box["running"]
    try:
        yield running
    finally:
        stop: trio.Event = box["stop"]
        with suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(stop.set, trio_token=running._token)
        thread.join(timeout)
        if settings.data_dir in _TEMPORARY_DIRS:
            _TEMPORARY_DIRS.discard(settings.data_dir)
            shutil.rmtree(settings.data_dir, ignore_errors=True)
        if "error" in box:
            raise box["error"]
