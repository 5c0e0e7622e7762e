"""Starting a separated-mode node: what it needs, and the errors that say what is missing."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest
import trio

from mop.backends.cluster import ClusterBackend
from mop.exception_groups import leaves
from mop.messaging import BackendError
from mop.node import StartupError, open_node
from mop.settings import ClusterSettings, Settings
from mop.testing.node import node_settings
from tests.e2e.clients import Client
from tests.e2e.cluster.support import proxy_process
from tests.e2e.nodeproc import broker_process
from tests.e2e.pulsar_support import free_port


def separated(**cluster: object) -> Settings:
    settings = node_settings()
    return dataclasses.replace(
        settings,
        mode="separated",
        protocols=Settings().protocols,  # the defaults: a proxy runs MQTT alone
        cluster=ClusterSettings(**cluster),  # type: ignore[arg-type]
    )


async def test_a_proxy_needs_a_service_url() -> None:
    with pytest.raises(StartupError, match=r"cluster\.service_url is required"):
        async with open_node(separated()):
            pass


async def test_the_pulsar_adapter_does_not_run_on_a_proxy() -> None:
    settings = dataclasses.replace(
        separated(service_url="pulsar://127.0.0.1:1"), protocols=("pulsar", "mqtt")
    )
    with pytest.raises(StartupError, match="Pulsar adapter runs on brokers"):
        async with open_node(settings):
            pass


async def test_unreachable_brokers_stop_the_start_with_a_clear_error() -> None:
    port = free_port()
    settings = separated(
        service_url=f"pulsar://127.0.0.1:{port}", operation_timeout=2.0, connect_timeout=1.0
    )
    with pytest.raises(StartupError, match=f"127.0.0.1:{port}"):
        async with open_node(settings):
            pass


async def test_refused_connections_stop_the_start_within_the_connect_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    # The operation timeout is far longer: the start must not wait for it.
    settings = separated(
        service_url=f"pulsar://127.0.0.1:{port}", operation_timeout=60.0, connect_timeout=1.5
    )
    started = trio.current_time()
    with pytest.raises(StartupError) as failed:
        async with open_node(settings):
            pass
    assert trio.current_time() - started < 4.0
    assert str(failed.value) == (
        f"cluster.service_url pulsar://127.0.0.1:{port}: no broker answered within"
        f" cluster.connect_timeout (1.5 s): pulsar://127.0.0.1:{port}: connection refused"
    )
    progress = [r.getMessage() for r in caplog.records if "cannot reach the brokers" in r.message]
    assert progress, caplog.text
    assert f"127.0.0.1:{port}: connection refused" in progress[0]
    assert "(cluster.connect_timeout)" in progress[0]


async def test_brokers_that_accept_but_never_answer_time_out_within_the_connect_timeout() -> None:
    with socket.socket() as silent:  # connections wait in its backlog, never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        settings = separated(
            service_url=f"pulsar://127.0.0.1:{port}", operation_timeout=60.0, connect_timeout=1.0
        )
        started = trio.current_time()
        with pytest.raises(StartupError, match=r"127\.0\.0\.1:\d+: timed out after 1 s"):
            async with open_node(settings):
                pass
        assert trio.current_time() - started < 3.0


async def test_a_backend_that_fails_to_start_leaves_nothing_running() -> None:
    backend = ClusterBackend(
        f"pulsar://127.0.0.1:{free_port()}", operation_timeout=1.0, connect_timeout=0.5
    )
    before = running_tasks()
    with pytest.raises(ExceptionGroup) as failed:
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
    [cause] = leaves(failed.value)
    assert isinstance(cause, BackendError) and "no broker answered" in str(cause), cause
    # Its Pulsar client is a system task (it outlives a cancelled `serve` until `aclose`), but
    # a backend that never started has no owner to call `aclose`.
    assert running_tasks() == before


def running_tasks() -> set[str]:
    """The tasks of the trio run beside the test's own (system tasks included)."""
    root = trio.lowlevel.current_root_task()
    return {task.name for nursery in root.child_nurseries for task in nursery.child_tasks}


def test_mop_run_as_a_proxy_serves_mqtt_and_stops_cleanly(tmp_path: Path) -> None:
    broker = broker_process(tmp_path / "broker")
    broker.start()
    proxy = proxy_process(
        tmp_path / "proxy",
        broker.service_url,
        MOP_PROTOCOLS='["mqtt", "pulsar"]',  # the defaults, as if unset: MQTT alone
    )
    try:
        port = proxy.start()
        sub = Client(port, "proxy-sub")
        sub.subscribe("run/+", 1)
        Client(port, "proxy-pub").publish("run/a", b"through mop run", 1)
        assert [m.payload for m in sub.expect(1)] == [b"through mop run"]
        sub.disconnect()
        assert proxy.stop() == 0, proxy.log()
        assert broker.stop() == 0, broker.log()
    finally:
        proxy.close()
        broker.close()
