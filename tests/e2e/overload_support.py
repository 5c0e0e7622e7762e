"""The overload guard of a running node, seen and driven from a test's thread."""

from __future__ import annotations

import dataclasses

from mop.overload.guard import OverloadGuard, OverloadStats
from mop.testing.node import RunningNode


def stats(node: RunningNode) -> OverloadStats:
    """A copy of the counters of the node's overload guard."""
    guard: OverloadGuard = node.node.processor.overload
    return node.call(lambda: dataclasses.replace(guard.stats))


def set_memory(node: RunningNode, used: float) -> None:
    """Give the node's guard a memory sample, as its watch would."""
    guard: OverloadGuard = node.node.processor.overload
    node.call(lambda: guard.observe_memory(int(used)))
