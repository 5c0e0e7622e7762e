"""Bucket histograms (`mop.counters.LatencyHistogram`) served through OpenTelemetry's exporters:
on the Prometheus page as histograms, and in what an OTLP exporter is given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import (
    Histogram,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from prometheus_client.parser import text_string_to_metric_families

from mop.counters import LatencyHistogram
from mop.observability import Telemetry, open_telemetry
from mop.observability.telemetry import _WithHistograms
from mop.settings import TelemetrySettings
from mop.testing.metrics import MetricsPage

Labels = tuple[tuple[str, str], ...]


def samples(telemetry: Telemetry, family: str) -> dict[tuple[str, Labels], float]:
    """The samples of one histogram on the Prometheus page: (sample name, sorted labels) ->
    value."""
    scraped = MetricsPage(telemetry.prometheus().body.decode())
    return {
        (name, tuple(sorted(labels))): value
        for (name, labels), value in scraped.samples.items()
        if name in (f"{family}_bucket", f"{family}_count", f"{family}_sum")
    }


@pytest.fixture
def telemetry() -> Telemetry:
    """A node's telemetry, with one instrument of the meter (a node always has some)."""
    telemetry = open_telemetry(TelemetrySettings(), mode="merged", node_name="test")
    telemetry.meter.create_counter("mop.test.things").add(2)
    return telemetry


def test_a_bucket_histogram_is_a_prometheus_histogram(telemetry: Telemetry) -> None:
    fast, slow = LatencyHistogram((0.01, 0.1)), LatencyHistogram((0.01, 0.1))
    for seconds in (0.005, 0.05, 0.5):
        fast.record(seconds)
    slow.record(1.0)
    telemetry.histograms.add(
        "mop.test.duration",
        lambda: [({"kind": "fast"}, fast), ({"kind": "slow"}, slow)],
        description="a test histogram",
    )
    found = samples(telemetry, "mop_test_duration_seconds")
    fast_kind = (("kind", "fast"),)
    assert found[("mop_test_duration_seconds_bucket", (*fast_kind, ("le", "0.01")))] == 1
    assert found[("mop_test_duration_seconds_bucket", (*fast_kind, ("le", "0.1")))] == 2
    assert found[("mop_test_duration_seconds_bucket", (*fast_kind, ("le", "+Inf")))] == 3
    assert found[("mop_test_duration_seconds_count", fast_kind)] == 3
    assert found[("mop_test_duration_seconds_sum", fast_kind)] == pytest.approx(0.555)
    assert found[("mop_test_duration_seconds_count", (("kind", "slow"),))] == 1
    # Cumulative: what is recorded later adds to it.
    fast.record(0.001)
    assert (
        samples(telemetry, "mop_test_duration_seconds")[
            ("mop_test_duration_seconds_count", fast_kind)
        ]
        == 4
    )


def test_the_histograms_are_served_beside_the_meter_metrics(telemetry: Telemetry) -> None:
    telemetry.histograms.add("mop.test.empty", lambda: [({}, LatencyHistogram())])
    page = telemetry.prometheus().body.decode()
    names = {metric.name for metric in text_string_to_metric_families(page)}
    assert {"mop_test_things", "mop_test_empty_seconds"} <= names
    found = samples(telemetry, "mop_test_empty_seconds")
    assert found[("mop_test_empty_seconds_count", ())] == 0


class Capture(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.exported: list[MetricsData] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def histogram_points(data: MetricsData, name: str) -> Sequence[Any]:
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    assert isinstance(metric.data, Histogram)
                    return metric.data.data_points
    raise AssertionError(f"{name} was not exported")


def test_an_exporter_is_given_the_histograms_with_what_the_sdk_collected(
    telemetry: Telemetry,
) -> None:
    histogram = LatencyHistogram((0.5,))
    histogram.record(0.25)
    histogram.record(0.75)
    telemetry.histograms.add("mop.test.duration", lambda: [({"a": "b"}, histogram)])
    capture = Capture()
    _WithHistograms(capture, telemetry.histograms, telemetry.collections).export(
        MetricsData(resource_metrics=[])
    )
    (point,) = histogram_points(capture.exported[0], "mop.test.duration")
    assert dict(point.attributes) == {"a": "b"}
    assert (point.count, point.sum, list(point.bucket_counts)) == (2, 1.0, [1, 1])
    assert (list(point.explicit_bounds), point.min, point.max) == ([0.5], 0.25, 0.75)
