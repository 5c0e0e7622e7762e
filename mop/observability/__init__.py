"""What a running node tells its operators: OpenTelemetry metrics (served as Prometheus text on
the admin port, optionally pushed over OTLP) and traces. `telemetry` is the one module that
configures OpenTelemetry; the rest of mop records through the objects it hands out."""

from mop.observability.telemetry import Telemetry, open_telemetry

__all__ = ["Telemetry", "open_telemetry"]
