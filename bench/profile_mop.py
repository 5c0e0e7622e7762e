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
        [py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--duration",
         str(max(1, round(seconds))), "--format", "raw", "--output", str(output)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _function(frame: str) -> str:
    """'Broker.publish (mop/broker/broker.py:133)' -> 'Broker.publish (mop/broker/broker.py)'."""
    return _LINE.sub(")", frame.strip())


def summarize(raw: Path, top: int = 25) -> str:
    """Markdown tables of the top functions by self and by inclusive samples."""
    self_samples: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    self_lines: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        self_samples[_function(frames[-1])] += count
        self_lines[frames[-1].strip()] += count
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

    return (
        f"{total} samples while the node was running (idle time in epoll is not sampled).\n\n"
        f"**Self time by function**\n\n{table(self_samples, 'function')}\n"
        f"**Self time by line**\n\n{table(self_lines, 'line')}\n"
        f"**Inclusive time**\n\n{table(inclusive, 'function')}"
    )
