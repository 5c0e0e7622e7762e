"""Turns the runs of a bench into its report: a markdown table of medians with ratios to the
reference broker, notes on what went wrong in which run, every run's numbers, and a PNG chart of
the same table.
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scenarios import Metric, Scenario, Sizes


@dataclass
class RunRecord:
    scenario: str
    broker: str
    round: int
    values: dict[str, float | None]
    notes: list[str]
    marked: list[str] = field(default_factory=list)
    broker_cpu: float | None = None  # cores the broker used while the load ran
    loadgen_cpu: float | None = None  # cores the generator used
    background_cpu: float | None = None  # cores everything else on the machine used
    detail: dict[str, Any] = field(default_factory=dict)


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return (
        f"{os.cpu_count()} x {model}, {mem_kb / 1048576:.0f} GiB RAM, Linux {platform.release()}, "
        f"Python {platform.python_version()}, loopback only"
    )


def label(metric: Metric, sizes: Sizes) -> str:
    def k(n: float) -> str:
        return f"{n / 1000:g}k" if n >= 1000 else f"{n:g}"

    return metric.label.format(
        idle=k(sizes.idle_conns),
        many=k(sizes.many_conns),
        rate=k(sizes.latency_rate),
        low_rate=k(sizes.latency_low_rate),
        rsubs=k(sizes.retained_subs),
        rtopics=k(sizes.retained_topics),
        queued=k(sizes.queued),
        fanout=sizes.fanout_subs,
        fanin=sizes.fanin_pubs,
    )


def fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "rate":
        if value >= 100_000:
            return f"{value / 1000:.0f}k"
        if value >= 1000:
            return f"{value / 1000:.1f}k"
        return f"{value:.0f}"
    if kind == "us":
        return f"{value:,.0f}"
    if kind == "kb":
        return f"{value:.1f}"
    if kind == "count":
        return f"{value:,.0f}"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def medians(
    records: Sequence[RunRecord],
) -> dict[tuple[str, str, str], tuple[float | None, int, int]]:
    """(scenario, broker, metric) -> (median of the runs that produced a number, numbers, runs)."""
    grouped: dict[tuple[str, str, str], list[float | None]] = {}
    for rec in records:
        for metric, value in rec.values.items():
            grouped.setdefault((rec.scenario, rec.broker, metric), []).append(value)
    out = {}
    for key, values in grouped.items():
        numbers = [v for v in values if v is not None]
        out[key] = (statistics.median(numbers) if numbers else None, len(numbers), len(values))
    return out


def ratio(value: float, ref: float) -> str:
    r = value / ref
    return f"{r:.0f}x" if r >= 100 else f"{r:.1f}x" if r >= 10 else f"{r:.2f}x"


def _cell(
    med: tuple[float | None, int, int] | None,
    ref: float | None,
    metric: Metric,
    is_ref: bool,
    marked: bool,
) -> str:
    if med is None:
        return "n/a"
    value, ok, runs = med
    text = fmt(value, metric.kind)
    if value is not None and ref and not is_ref:
        text += f" ({ratio(value, ref)})"
    if marked:
        text += " †"
    if ok < runs:
        text += f" [{ok}/{runs} runs]"
    return text


def markdown(
    *,
    title: str,
    records: Sequence[RunRecord],
    scenarios: Sequence[Scenario],
    brokers: Sequence[str],
    labels: dict[str, str],
    versions: dict[str, str],
    sizes: Sizes,
    sizes_name: str,
    reference: str,
    started: str,
    elapsed_s: float,
    ceiling: str,
    skipped: dict[str, str],
    command: str,
    chart: str | None,
    hop: tuple[str, Sequence[str]] | None = None,
    notes: Sequence[str] = (),
    targets: Sequence[str] = (),
) -> str:
    """The report; `hop` = (merged broker, separated brokers) adds the section on what the
    proxy hop costs, `notes` are lines for the list under the main table, `targets` the lines
    of the section on the targets (bench/targets.py), which follows it."""
    med = medians(records)
    marked = {(r.scenario, r.broker, key) for r in records for key in r.marked}
    lines = [
        f"# {title}",
        "",
        f"- date: {started}, {elapsed_s / 60:.1f} minutes: `{command}`",
        f"- machine: {machine()}",
        f"- mode: {sizes_name}; runs interleaved broker by broker (A B C A B C), each on a fresh "
        "broker process on its own loopback port; cells are medians",
        f"- load generator: {ceiling}",
        "- versions: " + "; ".join(f"{labels[b]}: {versions[b]}" for b in brokers),
        "",
        f"Ratios are value / {labels.get(reference, reference)}'s: above 1 is better for rates, "
        "below 1 is better for latencies, times and memory. `[n/m runs]`: only n of m runs "
        "produced the number (see the notes). †: the broker could not sustain the offered rate, so "
        "its latency is mostly time spent queueing.",
        "",
        "| scenario | " + " | ".join(labels[b] for b in brokers) + " |",
        "|---|" + "---:|" * len(brokers),
    ]
    for sc in scenarios:
        if sc.key in skipped:
            continue
        for metric in sc.metrics:
            ref = med.get((sc.key, reference, metric.key), (None, 0, 0))[0]
            cells = [
                _cell(
                    med.get((sc.key, b, metric.key)),
                    ref,
                    metric,
                    b == reference,
                    (sc.key, b, metric.key) in marked,
                )
                for b in brokers
            ]
            lines.append(f"| {label(metric, sizes)} | " + " | ".join(cells) + " |")
    if skipped:
        lines += ["", "Not run:"]
        lines += [f"- {key}: {why}" for key, why in skipped.items()]
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    lines += targets
    if chart:
        lines += ["", f"![chart]({chart})"]
    if hop:
        lines += hop_section(records, scenarios, hop[0], hop[1], labels, sizes, skipped)
    noted = [rec for rec in records if rec.notes]
    if noted:
        lines += ["", "## Notes", ""]
        lines += [
            f"- {rec.scenario} / {labels[rec.broker]} / run {rec.round + 1}: "
            + "; ".join(rec.notes)
            for rec in noted
        ]
    lines += ["", "## Every run", "", _runs_table(records, scenarios, labels, sizes)]
    return "\n".join(lines) + "\n"


def _hop_cell(
    sep: tuple[float | None, int, int] | None,
    base: tuple[float | None, int, int] | None,
    metric: Metric,
) -> str:
    """Separated next to merged: the ratio, and for latencies the difference in microseconds
    first (what the hop adds to every message)."""
    if sep is None or base is None or sep[0] is None or base[0] is None or not base[0]:
        return "-"
    text = ratio(sep[0], base[0])
    if metric.kind == "us":
        text = f"{sep[0] - base[0]:+,.0f} us ({text})"
    if sep[1] < sep[2] or base[1] < base[2]:
        text += " [not every run]"
    return text


def hop_section(
    records: Sequence[RunRecord],
    scenarios: Sequence[Scenario],
    base: str,
    separated: Sequence[str],
    labels: dict[str, str],
    sizes: Sizes,
    skipped: dict[str, str],
) -> list[str]:
    """The cost of the extra hop: each separated deployment against the merged node of the
    same run, scenario by scenario, from the same medians as the main table."""
    med = medians(records)
    lines = [
        "",
        "## Separated mode: the cost of the extra hop",
        "",
        f"Each separated deployment next to {labels[base]} in the same run, with the same storage "
        "settings: rates and times as separated / merged (for rates below 1 is the cost, for "
        "times and memory above 1), latencies as separated minus merged in microseconds (and the "
        "ratio). Publishers connect to the first proxy and subscribers to the last, so with two "
        "proxies every message goes proxy -> broker node -> other proxy.",
        "",
        "| scenario | " + " | ".join(f"{labels[b]} / {labels[base]}" for b in separated) + " |",
        "|---|" + "---:|" * len(separated),
    ]
    for sc in scenarios:
        if sc.key in skipped:
            continue
        for metric in sc.metrics:
            merged = med.get((sc.key, base, metric.key))
            cells = [_hop_cell(med.get((sc.key, b, metric.key)), merged, metric) for b in separated]
            lines.append(f"| {label(metric, sizes)} | " + " | ".join(cells) + " |")
    primes = _prime_times(records, [base, *separated])
    if primes:
        lines += [
            "",
            "fan-in is measured once the wildcard subscription has every publisher's topic: the "
            "run first sends one message per topic and waits for all of them. That wait (median) "
            "was " + ", ".join(f"{labels[b]} {t:.2f} s" for b, t in primes.items()) + " (a "
            "separated proxy finds topics created after a wildcard subscription by polling, "
            "`cluster.pattern_discovery`).",
        ]
    return lines


def _prime_times(records: Sequence[RunRecord], brokers: Sequence[str]) -> dict[str, float]:
    times: dict[str, list[float]] = {}
    for rec in records:
        if rec.broker in brokers and "prime_s" in rec.detail and rec.detail["prime_s"] > 0:
            times.setdefault(rec.broker, []).append(float(rec.detail["prime_s"]))
    return {b: statistics.median(times[b]) for b in brokers if b in times}


def _runs_table(
    records: Sequence[RunRecord],
    scenarios: Sequence[Scenario],
    labels: dict[str, str],
    sizes: Sizes,
) -> str:
    metrics = {sc.key: sc.metrics for sc in scenarios}
    rows = [
        "CPU columns are cores busy on average over the whole run (setup and settling included): "
        "the broker, the generator, and everything else on the machine (other work skews a run "
        "when it is high).",
        "",
        "| scenario | broker | run | values | broker CPU | loadgen CPU | other CPU |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for rec in records:
        values = ", ".join(
            f"{m.key}={fmt(rec.values.get(m.key), m.kind)}" for m in metrics.get(rec.scenario, ())
        )
        cpu = [
            f"{c:.2f}" if c is not None else "-"
            for c in (rec.broker_cpu, rec.loadgen_cpu, rec.background_cpu)
        ]
        rows.append(
            f"| {rec.scenario} | {labels[rec.broker]} | {rec.round + 1} | {values} | "
            + " | ".join(cpu)
            + " |"
        )
    return "\n".join(rows)


def chart(
    path: Path,
    *,
    records: Sequence[RunRecord],
    scenarios: Sequence[Scenario],
    brokers: Sequence[str],
    labels: dict[str, str],
    sizes: Sizes,
    skipped: dict[str, str],
) -> None:
    """One bar chart per table row: medians with the range of the runs as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(sc, m) for sc in scenarios if sc.key not in skipped for m in sc.metrics]
    if not rows:
        return
    cols = 3 if len(rows) > 4 else len(rows)
    nrows = (len(rows) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.4 * nrows), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, (sc, metric) in zip(axes.flat, rows, strict=False):
        meds, lows, highs = [], [], []
        for b in brokers:
            vals = [
                r.values.get(metric.key) for r in records if r.scenario == sc.key and r.broker == b
            ]
            nums = [v for v in vals if v is not None]
            m = statistics.median(nums) if nums else 0.0
            meds.append(m)
            lows.append(m - min(nums) if nums else 0.0)
            highs.append(max(nums) - m if nums else 0.0)
        xs = range(len(brokers))
        ax.bar(xs, meds, yerr=[lows, highs], color=[colors[i % 10] for i in xs], capsize=3)
        ax.set_xticks(list(xs), [labels[b] for b in brokers], rotation=30, ha="right", fontsize=8)
        ax.set_title(
            label(metric, sizes)
            + (" (higher is better)" if metric.higher_is_better else " (lower is better)"),
            fontsize=8,
        )
        positive = [m for m in meds if m > 0]
        if positive and max(positive) / min(positive) > 30:
            ax.set_yscale("log")
        for x, m in zip(xs, meds, strict=True):
            if m > 0:
                ax.annotate(fmt(m, metric.kind), (x, m), ha="center", va="bottom", fontsize=7)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
