"""gRPC on a separated proxy: health follows the brokers behind it (NOT_SERVING while they
cannot be reached, SERVING again once they can), and a node process serves gRPC on a free
port it logs."""

from __future__ import annotations

import dataclasses
import queue
import threading
import uuid
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mop.testing.node import as_proxy, node_settings, running_node
from tests.e2e.nodeproc import GRPC_LISTENING, NodeProcess, broker_process
from tests.e2e.pulsar.test_broker_cluster import free_ports

pytestmark = pytest.mark.e2e

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_health_follows_the_brokers_behind_a_proxy(tmp_path: Path) -> None:
    (pulsar_port,) = free_ports(1)
    broker = broker_process(tmp_path / "broker", MOP_PULSAR__PORT=str(pulsar_port))
    broker.start()
    try:
        settings = as_proxy(
            node_settings(), broker.service_url, namespace=f"t-{uuid.uuid4().hex[:12]}"
        )
        settings = dataclasses.replace(settings, protocols=("grpc",))
        with running_node(settings) as proxy:
            _, port = proxy.node.address("grpc")
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                watched: queue.Queue[int] = queue.Queue()
                answers = stub.Watch(health_pb2.HealthCheckRequest(), timeout=60)

                def watch() -> None:
                    try:
                        for answer in answers:
                            watched.put(answer.status)
                    except grpc.RpcError:
                        pass

                watcher = threading.Thread(target=watch, daemon=True)
                watcher.start()
                assert watched.get(timeout=10) == SERVING
                assert broker.stop() == 0
                assert watched.get(timeout=20) == NOT_SERVING
                assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == NOT_SERVING
                broker.start()
                assert watched.get(timeout=30) == SERVING
                answers.cancel()
                watcher.join(5)
    finally:
        broker.close()


def test_a_node_process_serves_grpc_on_the_port_it_logs(tmp_path: Path) -> None:
    node = NodeProcess(
        tmp_path / "data", listening=GRPC_LISTENING, MOP_PROTOCOLS='["mqtt", "grpc"]'
    )
    port = node.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == SERVING
        assert node.stop() == 0
    finally:
        node.close()
