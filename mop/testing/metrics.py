"""A node's `/metrics` page, parsed, for tests that check what it counted.

page = scrape_metrics(*node.address("admin"))
assert page.value("mop_connections_active", protocol="mqtt") == 1
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]


class MetricsPage:
    """One scrape of `/metrics`: samples by name and labels, OpenTelemetry's scope labels
    (`otel_scope_*`, the same on every sample) left out."""

    def __init__(self, text: str) -> None:
        self.samples: dict[tuple[str, Labels], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = frozenset(
                    (k, v) for k, v in sample.labels.items() if not k.startswith("otel_")
                )
                self.samples[(sample.name, labels)] = sample.value

    def value(self, name: str, **labels: str) -> float:
        """The sample of that name and exactly these labels; 0 when there is none."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def matching(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        """Every sample of that name whose labels include these."""
        wanted = set(labels.items())
        return [
            (dict(found), value)
            for (sample, found), value in self.samples.items()
            if sample == name and wanted <= found
        ]


def scrape_metrics(host: str, port: int, *, timeout: float = 10.0) -> MetricsPage:
    """GET `/metrics` from a node's admin listener; AssertionError unless it answers 200 in
    the Prometheus text format."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as response:
        assert response.status == 200, response.status
        content_type = response.headers["content-type"]
        assert content_type.startswith("text/plain; version="), content_type
        return MetricsPage(response.read().decode())
