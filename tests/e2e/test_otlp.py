"""Metrics and traces pushed over OTLP/HTTP to a collector: a small HTTP server on loopback
stands in for the OpenTelemetry Collector and decodes what a running node sends it."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mop.settings import TelemetrySettings
from mop.testing.node import node_settings, running_node
from tests.e2e.clients import Client

pytestmark = pytest.mark.e2e


class Collector:
    """Takes OTLP/HTTP protobuf exports on /v1/metrics and /v1/traces."""

    def __init__(self) -> None:
        self.metrics: queue.Queue[ExportMetricsServiceRequest] = queue.Queue()
        self.traces: queue.Queue[ExportTraceServiceRequest] = queue.Queue()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                assert self.headers["content-type"] == "application/x-protobuf"
                if self.path == "/v1/metrics":
                    collector.metrics.put(ExportMetricsServiceRequest.FromString(body))
                elif self.path == "/v1/traces":
                    collector.traces.put(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    running = Collector()
    try:
        yield running
    finally:
        running.close()


def metric_values(request: ExportMetricsServiceRequest) -> dict[str, float]:
    """The sum of the data points of every metric in one export, by name."""
    values: dict[str, float] = {}
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points = metric.sum.data_points or metric.gauge.data_points
                values[metric.name] = sum(p.as_int or p.as_double for p in points)
    return values


def test_metrics_and_traces_reach_an_otlp_collector(collector: Collector) -> None:
    telemetry = TelemetrySettings(
        otlp_metrics_endpoint=f"{collector.url}/v1/metrics",
        otlp_interval=0.5,
        trace_sample_ratio=1.0,
        otlp_traces_endpoint=f"{collector.url}/v1/traces",
    )
    settings = dataclasses.replace(node_settings(), telemetry=telemetry)
    with running_node(settings) as node:
        client = Client(node.mqtt_port, "otlp-1")
        client.subscribe("otlp/#", qos=1)
        assert client.publish("otlp/a", b"traced", qos=1) == 0
        (received,) = client.expect(1)
        traceparent = dict(received.properties.UserProperty)["traceparent"]

        deadline = time.monotonic() + 20
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "no export with the message counted"
            values = metric_values(collector.metrics.get(timeout=remaining))
            if values.get("mop.messages", 0) >= 2:
                break
        assert values["mop.connections.active"] == 1

    # Spans are sent in batches; the node's shutdown flushes the last one.
    trace_id = traceparent.split("-")[1]
    names: set[str] = set()
    while not collector.traces.empty():
        for resource in collector.traces.get_nowait().resource_spans:
            for scope in resource.scope_spans:
                names |= {span.name for span in scope.spans if span.trace_id.hex() == trace_id}
    assert {"publish", "store", "deliver"} <= {name.split(" ")[0] for name in names}, names
