"""The one place that configures OpenTelemetry for a node.

Each node gets its own MeterProvider and its own Prometheus registry (never the process-wide
defaults), so several nodes in one process (tests, an embedded broker) keep their numbers apart.
The OpenTelemetry Prometheus exporter turns the SDK's metrics into the exposition format; mop
writes none of it by hand. With `trace_sample_ratio` above 0 the node also gets its own
TracerProvider (sampling by trace id, following a sampled parent), exporting over OTLP when
`otlp_traces_endpoint` is set; at 0 there is none, and nothing on the message path traces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from mop.observability.histograms import BucketHistograms
from mop.observability.tracing import NodeTracing
from mop.settings import TelemetrySettings
from mop.version import VERSION

log = logging.getLogger("mop.telemetry")

METER_NAME = "mop"

_T = TypeVar("_T")


class Collections:
    """Counts the collections of a node's metrics (a scrape, an OTLP export): each reader
    calls `ended` once it has what it collected, so that the next collection reads afresh."""

    def __init__(self) -> None:
        self.number = 0

    def ended(self) -> None:
        self.number += 1


class PerCollection(Generic[_T]):
    """`read()` made once per collection: the instruments of one scrape that read the same
    walk (over sessions, subscriptions) share it, and the next scrape reads afresh. (A scrape
    and an OTLP export at the same time may each read it again: never a stale value.)"""

    def __init__(self, read: Callable[[], _T], collections: Collections) -> None:
        self._read = read
        self._collections = collections
        self._value: _T | None = None
        self._number = -1

    def __call__(self) -> _T:
        number = self._collections.number
        value = self._value
        if value is None or number != self._number:
            value = self._value = self._read()
            self._number = number
        return value


class TelemetryError(Exception):
    """The telemetry settings cannot be used (e.g. OTLP without its exporter installed)."""


@dataclass(frozen=True, slots=True)
class PrometheusPage:
    body: bytes
    content_type: str


class Telemetry:
    """A node's meter provider and what reads it: the Prometheus registry behind `/metrics`
    and, when configured, a periodic OTLP export; and its tracer provider when it traces,
    behind `tracing` (None when it does not)."""

    def __init__(
        self,
        provider: MeterProvider,
        registry: CollectorRegistry,
        histograms: BucketHistograms | None = None,
        tracer_provider: TracerProvider | None = None,
        collections: Collections | None = None,
    ) -> None:
        self._provider = provider
        self._registry = registry
        self.collections = collections or Collections()
        self.meter: Meter = provider.get_meter(METER_NAME, VERSION)
        # Histograms the hot path keeps itself, served with the meter's metrics.
        self.histograms = histograms or BucketHistograms(
            Resource.create({}), InstrumentationScope(METER_NAME, VERSION)
        )
        self._tracer_provider = tracer_provider
        self.tracing: NodeTracing | None = (
            NodeTracing(tracer_provider) if tracer_provider is not None else None
        )

    def per_collection(self, read: Callable[[], _T]) -> PerCollection[_T]:
        """`read` made once per collection of the metrics, for instruments that share it."""
        return PerCollection(read, self.collections)

    def export_spans_to(self, exporter: SpanExporter) -> None:
        """Also hand every span to `exporter` as it ends (tests read them from an
        `InMemorySpanExporter`). TelemetryError when the node does not trace."""
        if self._tracer_provider is None:
            raise TelemetryError("tracing is off (telemetry.trace_sample_ratio = 0)")
        self._tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))

    def prometheus(self) -> PrometheusPage:
        """The current value of every metric in the Prometheus text format."""
        return PrometheusPage(generate_latest(self._registry), CONTENT_TYPE_LATEST)

    def shutdown(self) -> None:
        """Stop the exporters (a last OTLP export included); the node calls it once."""
        for provider in (self._provider, self._tracer_provider):
            if provider is None:
                continue
            try:
                provider.shutdown()
            except Exception:  # an exporter that fails on the way out must not stop the exit
                log.exception("telemetry shutdown")


def open_telemetry(settings: TelemetrySettings, *, mode: str, node_name: str) -> Telemetry:
    """A node's telemetry: Prometheus always, OTLP metrics when `otlp_metrics_endpoint` is set,
    traces when `trace_sample_ratio` is above 0 (over OTLP when `otlp_traces_endpoint` is set).
    The resource names the service "mop" with the node's mode and name."""
    registry = CollectorRegistry(auto_describe=True)
    resource = Resource.create(
        {
            "service.name": "mop",
            "service.version": VERSION,
            "service.instance.id": node_name,
            "mop.mode": mode,
        }
    )
    histograms = BucketHistograms(resource, InstrumentationScope(METER_NAME, VERSION))
    collections = Collections()
    readers: list[MetricReader] = [_PrometheusReader(registry, histograms, collections)]
    if settings.otlp_metrics_endpoint:
        readers.append(_otlp_reader(settings, histograms, collections))
    provider = MeterProvider(metric_readers=readers, resource=resource)
    return Telemetry(
        provider,
        registry,
        histograms=histograms,
        tracer_provider=_tracer_provider(settings, resource),
        collections=collections,
    )


def _tracer_provider(settings: TelemetrySettings, resource: Resource) -> TracerProvider | None:
    ratio = settings.trace_sample_ratio
    if ratio <= 0:
        return None
    # A message whose trace context says sampled is traced whatever the ratio: the trace
    # began upstream and stays whole.
    provider = TracerProvider(
        resource=resource,
        sampler=ParentBased(TraceIdRatioBased(ratio)),
        shutdown_on_exit=False,  # the node shuts it down (several nodes live in one process)
    )
    if settings.otlp_traces_endpoint:
        provider.add_span_processor(BatchSpanProcessor(_otlp_span_exporter(settings)))
    else:
        log.info(
            "tracing %g of messages: trace context is propagated, spans are not exported"
            " (telemetry.otlp_traces_endpoint is not set)",
            ratio,
        )
    return provider


def _otlp_span_exporter(settings: TelemetrySettings) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TelemetryError(
            "telemetry.otlp_traces_endpoint needs the OTLP exporter: pip install 'mop[otlp]'"
        ) from None
    return OTLPSpanExporter(endpoint=settings.otlp_traces_endpoint)


class _PrometheusReader(PrometheusMetricReader):
    """OpenTelemetry's Prometheus reader, given the bucket histograms with what it collects."""

    def __init__(
        self, registry: CollectorRegistry, histograms: BucketHistograms, collections: Collections
    ) -> None:
        self._histograms = histograms
        self._collections = collections
        super().__init__(registry=registry)

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        # (Not called when the meter has no instrument at all: a node always has some.)
        self._collections.ended()
        super()._receive_metrics(self._histograms.extend(metrics_data), timeout_millis, **kwargs)


class _WithHistograms(MetricExporter):
    """An exporter that exports the bucket histograms with what the SDK collected."""

    def __init__(
        self, exporter: MetricExporter, histograms: BucketHistograms, collections: Collections
    ) -> None:
        # The reader asks the exporter which temporality and aggregation it prefers.
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self._histograms = histograms
        self._collections = collections

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self._collections.ended()
        return self._exporter.export(
            self._histograms.extend(metrics_data), timeout_millis=timeout_millis, **kwargs
        )

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


def _otlp_reader(
    settings: TelemetrySettings, histograms: BucketHistograms, collections: Collections
) -> MetricReader:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        raise TelemetryError(
            "telemetry.otlp_metrics_endpoint needs the OTLP exporter: pip install 'mop[otlp]'"
        ) from None
    exporter = OTLPMetricExporter(endpoint=settings.otlp_metrics_endpoint)
    return PeriodicExportingMetricReader(
        _WithHistograms(exporter, histograms, collections),
        export_interval_millis=settings.otlp_interval * 1000,
    )
