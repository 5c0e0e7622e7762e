"""What callers of the cluster backend see when tasks opened in parallel fail."""

from __future__ import annotations

import pytest
import trio

from mop.backends.cluster.legs import in_parallel, one_error_for_callers
from mop.processor.backend import BackendError


async def test_failures_that_are_all_backend_errors_come_out_as_one() -> None:
    async def fail(topic: str) -> None:
        await trio.lowlevel.checkpoint()
        raise BackendError(f"{topic}: refused", reason="not_supported")

    with pytest.raises(BackendError) as caught:
        await in_parallel(["a", "b"], fail)
    assert caught.value.reason == "not_supported"


async def test_anything_else_in_the_group_keeps_the_group() -> None:
    async def backend() -> None:
        raise BackendError("refused")

    async def bug() -> None:
        raise KeyError("a bug")

    with pytest.raises(BaseExceptionGroup) as caught:
        async with one_error_for_callers(), trio.open_nursery() as nursery:
            nursery.start_soon(backend)
            nursery.start_soon(bug)
    assert caught.group_contains(KeyError)
