"""The node's memory high-water mark, with hysteresis: over the high mark the node pushes back
on publishers, and it goes back to normal only below the low mark, so that it does not flap.
Pure: the memory used and the memory of the machine come in as numbers of bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["MemoryPressure", "Watermarks", "resolve_watermarks"]

# The low mark when none is set, as a fraction of the high one.
DEFAULT_LOW_FRACTION: Final = 0.9


@dataclass(frozen=True, slots=True)
class Watermarks:
    """Memory in bytes: over at `high`, back to normal below `low` (`low` < `high`)."""

    high: int
    low: int

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError(f"need 0 < low < high (got low {self.low}, high {self.high})")


def _in_bytes(value: float, total_memory: int) -> int:
    """A setting of `limits.memory_*_watermark` in bytes: up to 1 it is a fraction of the
    machine's memory, above 1 a number of bytes."""
    return int(value * total_memory) if value <= 1 else int(value)


def resolve_watermarks(high: float, low: float, total_memory: int) -> Watermarks | None:
    """The marks that `limits.memory_high_watermark` and `limits.memory_low_watermark` set on a
    machine with `total_memory` bytes; None when the high mark is 0 (no mark). A low mark of
    0 is 90% of the high one. ValueError when the low mark is not below the high one."""
    if high <= 0:
        return None
    high_bytes = _in_bytes(high, total_memory)
    low_bytes = _in_bytes(low, total_memory) if low > 0 else int(high_bytes * DEFAULT_LOW_FRACTION)
    return Watermarks(high_bytes, low_bytes)


class MemoryPressure:
    """Whether memory is over the high-water mark: it goes over when a sample reaches `high`
    and stays over until a sample is below `low`."""

    __slots__ = ("marks", "over", "used")

    def __init__(self, marks: Watermarks) -> None:
        self.marks = marks
        self.over = False
        self.used = 0  # bytes at the last sample

    def pressing(self, used: int) -> bool:
        """Whether a sample of `used` bytes would keep the memory over the mark, or put it
        over: at or above `low` while over, at or above `high` while not."""
        return used >= (self.marks.low if self.over else self.marks.high)

    def observe(self, used: int) -> bool:
        """Take a sample of the memory used, in bytes; True when it changed `over`."""
        self.used = used
        if self.over:
            if used < self.marks.low:
                self.over = False
                return True
        elif used >= self.marks.high:
            self.over = True
            return True
        return False
