"""The memory high-water mark: its settings in bytes, and hysteresis."""

from __future__ import annotations

import pytest

from mop.overload.watermark import MemoryPressure, Watermarks, resolve_watermarks

GIB = 1 << 30


def test_no_high_mark_means_no_marks() -> None:
    assert resolve_watermarks(0.0, 0.0, 16 * GIB) is None
    assert resolve_watermarks(0.0, 0.5, 16 * GIB) is None


def test_up_to_one_is_a_fraction_of_the_memory() -> None:
    assert resolve_watermarks(0.5, 0.25, 16 * GIB) == Watermarks(8 * GIB, 4 * GIB)
    assert resolve_watermarks(1.0, 0.0, 10 * GIB) == Watermarks(10 * GIB, 9 * GIB)


def test_above_one_is_bytes() -> None:
    assert resolve_watermarks(2e9, 1.5e9, 16 * GIB) == Watermarks(2_000_000_000, 1_500_000_000)
    # The low mark defaults to 90% of the high one.
    assert resolve_watermarks(1000.0, 0.0, 16 * GIB) == Watermarks(1000, 900)


def test_a_low_mark_must_be_below_the_high_one() -> None:
    with pytest.raises(ValueError, match="low < high"):
        resolve_watermarks(1e9, 2e9, 16 * GIB)
    with pytest.raises(ValueError, match="low < high"):
        resolve_watermarks(0.5, 0.5, 16 * GIB)


def test_pressure_goes_over_at_the_high_mark_and_back_below_the_low() -> None:
    pressure = MemoryPressure(Watermarks(high=1000, low=800))
    assert not pressure.over
    assert [pressure.observe(used) for used in (500, 999)] == [False, False]
    assert not pressure.over
    assert pressure.observe(1000) is True  # changed
    assert pressure.over
    # Between the marks it stays over (no flapping around the high mark).
    assert [pressure.observe(used) for used in (1200, 900, 999, 800)] == [False] * 4
    assert pressure.over
    assert pressure.observe(799) is True
    assert not pressure.over
    assert pressure.used == 799
    # And between the marks on the way up it stays normal.
    assert pressure.observe(950) is False
    assert not pressure.over


def test_a_sample_presses_when_it_would_put_or_keep_the_memory_over() -> None:
    pressure = MemoryPressure(Watermarks(high=1000, low=800))
    assert [pressure.pressing(used) for used in (799, 800, 999, 1000)] == [
        False,
        False,
        False,
        True,
    ]
    pressure.observe(1000)
    assert [pressure.pressing(used) for used in (799, 800, 999, 1000)] == [
        False,
        True,
        True,
        True,
    ]
