"""The rows of the merged node's performance targets (issue #17) and whether a run meets them:
mop next to mosquitto measured in the same run, and next to the floor of a minimal trio relay
(bench/floor_server.py) too, in every row whose scenarios the floor runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from report import fmt, label, ratio
from scenarios import SCENARIOS, Metric, Sizes

Medians = dict[tuple[str, str, str], tuple[float | None, int, int]]

# Which mop node the rows are about, first present first: the issue measured fsync interval, and
# asked for the per-message path in compiled form. With the compiled build, the checkout's mop
# with the same settings gets a column of its own (`PURE`).
MOP_PREFERENCE = ("mop-compiled", "mop-interval", "mop-never", "mop-always")
PURE = "mop-interval"
FLOOR = "trio-floor"


@dataclass(frozen=True)
class Part:
    """One number of a row: a metric of a scenario."""

    scenario: str
    metric: str


@dataclass(frozen=True)
class Goal:
    """A bound on one part: on mop's value (`relative` False) or on mop / reference."""

    part: Part
    bound: float
    at_least: bool
    relative: bool

    def describe(self) -> str:
        sign = ">=" if self.at_least else "<="
        name = "p99 " if self.part.metric == "lat_p99" else ""
        if self.relative:
            return f"{name}{sign} {self.bound:g}x"
        kind = _kind(self.part)
        if kind == "count" and not self.bound:
            return "none dropped"
        unit = {"kb": " KB", "rate": "/s"}.get(kind, "")
        return f"{sign} {fmt(self.bound, kind)}{unit}"

    def met(self, value: float, reference: float | None) -> bool | None:
        if self.relative:
            if not reference:
                return None
            value = value / reference
        return value >= self.bound if self.at_least else value <= self.bound


@dataclass(frozen=True)
class Row:
    title: str  # with the placeholders of the metrics' labels ({fanout}, {rate}, ...)
    parts: tuple[Part, ...]
    goals: tuple[Goal, ...]

    @property
    def floor(self) -> bool:
        """Whether the floor server has numbers for it: it runs all of the row's scenarios."""
        return all(SCENARIOS[part.scenario].floor for part in self.parts)


def _rate(title: str, scenario: str, metric: str, at_least: float) -> Row:
    part = Part(scenario, metric)
    return Row(title, (part,), (Goal(part, at_least, at_least=True, relative=True),))


def _latency(title: str, scenario: str) -> Row:
    p50, p99 = Part(scenario, "lat_p50"), Part(scenario, "lat_p99")
    return Row(title, (p50, p99), (Goal(p99, 3.0, at_least=False, relative=True),))


_FANIN = Part("fanin", "msgs")
_DROPPED = Part("fanin", "dropped")
_CONN_RATE = Part("conns", "conn_rate")
_CONN_KB = Part("conns", "conn_kb")

ROWS: tuple[Row, ...] = (
    _rate("QoS 0 1 -> 1 msgs/s", "qos0", "msgs", 1.0),
    _rate("QoS 1 1 -> 1 msgs/s", "qos1", "msgs", 1.0),
    _rate("QoS 2 1 -> 1 msgs/s", "qos2", "msgs", 1.0),
    _rate("fan-out 1 -> {fanout} deliveries/s", "fanout", "deliveries", 2.5),
    Row(
        "fan-in {fanin} -> 1 wildcard msgs/s / QoS 0 messages dropped",
        (_FANIN, _DROPPED),
        (
            Goal(_FANIN, 1.0, at_least=True, relative=True),
            Goal(_DROPPED, 0.0, at_least=False, relative=False),
        ),
    ),
    _latency("QoS 1 at {low_rate} msgs/s: p50 / p99 us", "latency1k"),
    _latency("QoS 1 at {rate} msgs/s: p50 / p99 us", "latency"),
    Row(
        "{idle} idle connections: connects/s / KB per connection",
        (_CONN_RATE, _CONN_KB),
        (
            Goal(_CONN_RATE, 15_000, at_least=True, relative=False),
            Goal(_CONN_KB, 5.0, at_least=False, relative=False),
        ),
    ),
)


def _kind(part: Part) -> str:
    return next(m.kind for m in SCENARIOS[part.scenario].metrics if m.key == part.metric)


def _value(med: Medians, broker: str, part: Part) -> float | None:
    return med.get((part.scenario, broker, part.metric), (None, 0, 0))[0]


def _values(med: Medians, broker: str, row: Row) -> str:
    values = [_value(med, broker, part) for part in row.parts]
    if all(v is None for v in values):
        return "-"
    return " / ".join(fmt(v, _kind(p)) for v, p in zip(values, row.parts, strict=True))


def _ratios(med: Medians, broker: str, reference: str, row: Row) -> str:
    cells = []
    for part in row.parts:
        value, ref = _value(med, broker, part), _value(med, reference, part)
        if _kind(part) == "count":
            continue  # a ratio to zero drops says nothing
        cells.append(ratio(value, ref) if value is not None and ref else "-")
    return " / ".join(cells)


def _verdict(med: Medians, mop: str, reference: str, row: Row) -> str:
    missed = []
    for goal in row.goals:
        value = _value(med, mop, goal.part)
        met = None if value is None else goal.met(value, _value(med, reference, goal.part))
        if met is None:
            return "no number"
        if not met:
            missed.append(goal)
    if not missed:
        return "met"
    if len(missed) == len(row.goals):
        return "missed"
    return "missed: " + ", ".join(m.describe() for m in missed)


def mop_broker(brokers: Sequence[str]) -> str | None:
    return next((b for b in MOP_PREFERENCE if b in brokers), None)


def section(
    med: Medians,
    brokers: Sequence[str],
    labels: dict[str, str],
    reference: str,
    sizes: Sizes,
    run: Sequence[str],
    skipped: dict[str, str],
) -> list[str]:
    """The target rows of the scenarios `run` as a markdown section (empty without mop and
    the reference broker)."""
    mop = mop_broker(brokers)
    if mop is None or reference not in brokers:
        return []
    floor = FLOOR in brokers
    pure = PURE if mop != PURE and PURE in brokers else None
    ref, mine = labels[reference], labels[mop]
    header = f"| target row | {ref} | {mine} | {mine} / {ref} |"
    if pure:
        header += f" {labels[pure]} | {labels[pure]} / {ref} |"
    if floor:
        header += f" {labels[FLOOR]} | {mine} / {labels[FLOOR]} |"
    header += " target | |"
    lines = [
        "",
        "## Targets",
        "",
        f"The rows of the merged node's targets, {mine} next to {ref} in this run (and next to "
        f"{labels[FLOOR] if floor else 'the trio floor'}: the least MQTT relay in plain trio, "
        "which forwards each PUBLISH at once and keeps no session, queue or retained message, "
        "bench/floor_server.py; what any trio broker pays at least). Relative targets are on "
        f"{mine} / {ref}; the latency targets are on p99."
        + (f" {labels[pure]} is the same node from the source, not compiled." if pure else ""),
        "",
        header,
        "|---|" + "---:|" * (header.count("|") - 3) + "---|",
    ]
    for row in ROWS:
        if any(part.scenario in skipped or part.scenario not in run for part in row.parts):
            continue
        cells = [
            _values(med, reference, row),
            _values(med, mop, row),
            _ratios(med, mop, reference, row),
        ]
        if pure:
            cells += [_values(med, pure, row), _ratios(med, pure, reference, row)]
        if floor:
            cells += (
                [_values(med, FLOOR, row), _ratios(med, mop, FLOOR, row)] if row.floor else ["", ""]
            )
        cells += [
            ", ".join(goal.describe() for goal in row.goals),
            _verdict(med, mop, reference, row),
        ]
        title = label(Metric("", row.title, "rate", True), sizes)  # fills the placeholders
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines
