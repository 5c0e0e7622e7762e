"""Latency histograms that the hot path keeps as bucket arrays (`mop.counters.LatencyHistogram`),
handed to OpenTelemetry's exporters as SDK histogram points when a reader collects.

The SDK's own Histogram costs microseconds per `record` (measured 2.8-4.4 us here, with
attributes); a bucket array costs a bisect and a few adds, which is what lets the hot path time
its messages at all. OpenTelemetry has no observable histogram, so the readers that serve mop's
metrics (the Prometheus reader behind `/metrics`, the OTLP exporter) add these points to what
the SDK collected (`BucketHistograms.extend`); the exporters then write them like any other
histogram, in their own formats.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from mop.counters import LatencyHistogram

__all__ = ["BucketHistograms", "HistogramReading"]

# One histogram of a metric: its attributes and its buckets.
HistogramReading = tuple[Mapping[str, str], LatencyHistogram]


@dataclass(frozen=True, slots=True)
class _Source:
    name: str
    unit: str
    description: str
    read: Callable[[], Iterable[HistogramReading]]


class BucketHistograms:
    """The bucket histograms of one node, as SDK metrics of `scope` on `resource`."""

    def __init__(self, resource: Resource, scope: InstrumentationScope) -> None:
        self._resource = resource
        self._scope = scope
        self._sources: list[_Source] = []
        self._started = time.time_ns()

    def add(
        self,
        name: str,
        read: Callable[[], Iterable[HistogramReading]],
        *,
        unit: str = "s",
        description: str = "",
    ) -> None:
        """Serve metric `name`: one histogram point per (attributes, histogram) that `read`
        gives when a reader collects."""
        self._sources.append(_Source(name, unit, description, read))

    def metrics(self) -> list[Metric]:
        now = time.time_ns()
        return [
            Metric(
                name=source.name,
                description=source.description,
                unit=source.unit,
                data=Histogram(
                    data_points=[
                        self._point(attributes, histogram, now)
                        for attributes, histogram in source.read()
                    ],
                    aggregation_temporality=AggregationTemporality.CUMULATIVE,
                ),
            )
            for source in self._sources
        ]

    def _point(
        self, attributes: Mapping[str, str], histogram: LatencyHistogram, now: int
    ) -> HistogramDataPoint:
        # A copy first: the count is the sum of these buckets even if the hot path (another
        # thread, for an OTLP export) records meanwhile.
        counts = list(histogram.counts)
        count = sum(counts)
        return HistogramDataPoint(
            attributes=dict(attributes),
            start_time_unix_nano=self._started,
            time_unix_nano=now,
            count=count,
            sum=histogram.total,
            bucket_counts=counts,
            explicit_bounds=list(histogram.bounds),
            min=histogram.low if count else 0.0,
            max=histogram.high if count else 0.0,
        )

    def extend(self, data: MetricsData) -> MetricsData:
        """`data` as collected by the SDK, with these histograms added to the node's scope."""
        if not self._sources:
            return data
        extra = self.metrics()
        resources = list(data.resource_metrics)
        if not resources:
            scope = ScopeMetrics(scope=self._scope, metrics=extra, schema_url="")
            return MetricsData([ResourceMetrics(self._resource, [scope], "")])
        first = resources[0]
        scopes = list(first.scope_metrics)
        for index, scope_metrics in enumerate(scopes):
            if scope_metrics.scope.name == self._scope.name:
                scopes[index] = dataclasses.replace(
                    scope_metrics, metrics=[*scope_metrics.metrics, *extra]
                )
                break
        else:
            scopes.append(ScopeMetrics(scope=self._scope, metrics=extra, schema_url=""))
        resources[0] = dataclasses.replace(first, scope_metrics=scopes)
        return MetricsData(resource_metrics=resources)
