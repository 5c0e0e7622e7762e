"""Sampling profile of a running mop node with py-spy, summarised as the functions with the most
self time and the most inclusive time (share of the samples in which mop was running).

Used by `mqtt_bench.py --profile`; py-spy is installed with pip when it is missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(r":\d+\)$")


class ProfileError(RuntimeError):
    """py-spy is not available or could not attach."""


def py_spy() -> str:
    found = shutil.which("py-spy")
    if found:
        return found
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=False)
    found = shutil.which("py-spy")
    if not found:
        raise ProfileError("py-spy is not installed and `pip install py-spy` did not provide it")
    return found


def record(pid: int, seconds: float, output: Path, rate: int = 200) -> subprocess.Popen[str]:
    """Start sampling `pid` for `seconds` into `output` (collapsed stacks); wait on the result."""
    return subprocess.Popen(
        [
            py_spy(),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--duration",
            str(max(1, round(seconds))),
            "--format",
            "raw",
            "--output",
            str(output),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _function(frame: str) -> str:
    """'Broker.publish (mop/broker/broker.py:133)' -> 'Broker.publish (mop/broker/broker.py)'."""
    return _LINE.sub(")", frame.strip())


def summarize(raw: Path, seconds: float, rate: int, top: int = 25) -> str:
    """Markdown tables of the top functions by self and by inclusive samples of the node's main
    (trio) thread, and of where dataclass instances are built (their generated `__init__` shows
    up as one anonymous function otherwise)."""
    self_samples: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    self_lines: Counter[str] = Counter()
    constructors: Counter[str] = Counter()
    total = other = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if not frames[0].startswith("_run_module_as_main"):
            other += count  # a worker thread (storage I/O): it does not hold up the event loop
            continue
        total += count
        self_samples[_function(frames[-1])] += count
        self_lines[frames[-1].strip()] += count
        if frames[-1].startswith("__create_fn__") and len(frames) > 1:
            constructors[frames[-2].strip()] += count
        for name in {_function(frame) for frame in frames}:
            inclusive[name] += count
    if not total:
        return "(no samples)\n"

    def table(counter: Counter[str], heading: str) -> str:
        rows = [f"| {heading} | samples | % |", "|---|---:|---:|"]
        rows += [
            f"| `{name}` | {count} | {100 * count / total:.1f} |"
            for name, count in counter.most_common(top)
        ]
        return "\n".join(rows) + "\n"

    possible = max(1, round(seconds * rate))
    return (
        f"{total} samples of the event loop thread while it was running, of {possible} taken: "
        f"it was busy {min(100, 100 * total / possible):.0f}% of the time (idle time in epoll is "
        f"not sampled); {other} samples of other threads (storage writes).\n\n"
        f"**Self time by function**\n\n{table(self_samples, 'function')}\n"
        f"**Self time by line**\n\n{table(self_lines, 'line')}\n"
        f"**Dataclass constructors by calling line**\n\n{table(constructors, 'caller')}\n"
        f"**Inclusive time**\n\n{table(inclusive, 'function')}"
    )
