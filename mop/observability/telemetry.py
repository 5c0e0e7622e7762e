"""The one place that configures OpenTelemetry for a node.

Each node gets its own MeterProvider and its own Prometheus registry (never the process-wide
defaults), so several nodes in one process (tests, an embedded broker) keep their numbers apart.
The OpenTelemetry Prometheus exporter turns the SDK's metrics into the exposition format; mop
writes none of it by hand.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from mop.settings import TelemetrySettings
from mop.version import VERSION

log = logging.getLogger("mop.telemetry")

METER_NAME = "mop"


class TelemetryError(Exception):
    """The telemetry settings cannot be used (e.g. OTLP without its exporter installed)."""


@dataclass(frozen=True, slots=True)
class PrometheusPage:
    body: bytes
    content_type: str


class Telemetry:
    """A node's meter provider and what reads it: the Prometheus registry behind `/metrics`
    and, when configured, a periodic OTLP export."""

    def __init__(self, provider: MeterProvider, registry: CollectorRegistry) -> None:
        self._provider = provider
        self._registry = registry
        self.meter: Meter = provider.get_meter(METER_NAME, VERSION)

    def prometheus(self) -> PrometheusPage:
        """The current value of every metric in the Prometheus text format."""
        return PrometheusPage(generate_latest(self._registry), CONTENT_TYPE_LATEST)

    def shutdown(self) -> None:
        """Stop the exporters (a last OTLP export included); the node calls it once."""
        try:
            self._provider.shutdown()
        except Exception:  # an exporter that fails on the way out must not stop the node's exit
            log.exception("telemetry shutdown")


def open_telemetry(settings: TelemetrySettings, *, mode: str, node_name: str) -> Telemetry:
    """A node's telemetry: Prometheus always, OTLP metrics when `otlp_metrics_endpoint` is set.
    The resource names the service "mop" with the node's mode and name."""
    registry = CollectorRegistry(auto_describe=True)
    readers: list[MetricReader] = [PrometheusMetricReader(registry=registry)]
    if settings.otlp_metrics_endpoint:
        readers.append(_otlp_reader(settings))
    resource = Resource.create(
        {
            "service.name": "mop",
            "service.version": VERSION,
            "service.instance.id": node_name,
            "mop.mode": mode,
        }
    )
    provider = MeterProvider(metric_readers=readers, resource=resource)
    return Telemetry(provider, registry)


def _otlp_reader(settings: TelemetrySettings) -> MetricReader:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        raise TelemetryError(
            "telemetry.otlp_metrics_endpoint needs the OTLP exporter: pip install 'mop[otlp]'"
        ) from None
    exporter = OTLPMetricExporter(endpoint=settings.otlp_metrics_endpoint)
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=settings.otlp_interval * 1000
    )
