"""Client leases: one connection per client id across the deployment. Taking an id fences the
holder (which learns it from `wait_fenced`) and waits until the holder lets go."""

from __future__ import annotations

import pytest
import trio

from mop.processor.backend import Backend, ClientLease
from tests.conformance.harness import DEADLINE, QUIET, Names


@pytest.mark.parametrize("via", ["same", "peer"])
async def test_taking_a_client_id_fences_the_holder_and_waits_for_it(
    backend: Backend, peer: Backend, names: Names, via: str
) -> None:
    client_id = names.sub("client")
    taker = backend if via == "same" else peer
    first = await backend.open_client(client_id)
    assert first.client_id == client_id
    taken: list[ClientLease] = []
    took = trio.Event()

    async def take_over() -> None:
        taken.append(await taker.open_client(client_id))
        took.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_over)
        with trio.fail_after(DEADLINE):
            await first.wait_fenced()
        assert taken == [], "the id was taken before its holder let go"
        await first.release()
        with trio.fail_after(DEADLINE):
            await took.wait()
    [second] = taken
    assert second.client_id == client_id
    with trio.move_on_after(QUIET) as quiet:
        await second.wait_fenced()
    assert quiet.cancelled_caught, "the new holder is fenced too"
    await second.release()


async def test_a_released_client_id_is_taken_at_once(backend: Backend, names: Names) -> None:
    client_id = names.sub("client")
    lease = await backend.open_client(client_id)
    await lease.release()
    with trio.fail_after(DEADLINE):
        again = await backend.open_client(client_id)
    await again.release()


async def test_client_ids_are_independent(backend: Backend, names: Names) -> None:
    one = await backend.open_client(names.sub("one"))
    with trio.fail_after(DEADLINE):
        two = await backend.open_client(names.sub("two"))
    with trio.move_on_after(QUIET) as quiet:
        await one.wait_fenced()
    assert quiet.cancelled_caught, "another client id fenced this one"
    await one.release()
    await two.release()
