"""Publishers wait for the subscribers their messages queue for (`SubscriberPressure`): a
publish batch returns once the subscriber took its backlog, drops nothing meanwhile, and is
released by a subscriber that stalls or leaves; a publisher does not wait for its own
subscriptions; with no byte bound nobody waits."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from mop.backends.local import LocalBackend
from mop.message import Message
from mop.processor.backend import Backend, Consumer
from tests.unit.backends.local.support import T, spec

STALL = 0.2
MESSAGES = 10


@pytest.fixture
def backend_options() -> dict[str, Any]:
    # Room for 2 messages in a consumer's receive queue, then the subscription's backlog.
    return {"receiver_queue": 2, "subscriber_stall_timeout": STALL}


def _batch(count: int = MESSAGES) -> list[tuple[str, Message]]:
    return [(T, Message(b"%d" % n, qos=0)) for n in range(count)]


def _dropped(backend: Backend) -> int:
    assert isinstance(backend, LocalBackend)
    return backend.stats().messages_dropped


async def _subscribe(backend: Backend) -> Consumer:
    return await backend.subscribe(spec(max_backlog=2, auto_ack_qos0=True))


async def _take(consumer: Consumer, count: int) -> list[bytes]:
    payloads: list[bytes] = []
    while len(payloads) < count:
        payloads += [d.message.payload for d in await consumer.receive(count)]
    return payloads


async def test_a_publish_returns_once_the_subscriber_took_its_backlog(backend: Backend) -> None:
    consumer = await _subscribe(backend)
    returned = trio.Event()

    async def publish() -> None:
        await backend.publish_batch(_batch())
        returned.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish)
        await trio.sleep(STALL / 4)
        assert not returned.is_set()  # 8 messages wait beyond the receive queue
        # Beyond max_backlog (2), yet nothing is dropped: the publisher waits instead.
        assert await _take(consumer, MESSAGES) == [b"%d" % n for n in range(MESSAGES)]
        with trio.fail_after(STALL / 2):  # released by the subscriber, not by the stall
            await returned.wait()
    assert _dropped(backend) == 0


async def test_a_subscriber_that_takes_nothing_stalls_and_then_holds_nobody(
    backend: Backend,
) -> None:
    await _subscribe(backend)
    start = trio.current_time()
    await backend.publish_batch(_batch())
    assert trio.current_time() - start >= STALL
    assert _dropped(backend) == 0  # that batch was waited for
    with trio.fail_after(STALL / 2):
        await backend.publish_batch(_batch())  # stalled: the max_backlog rule drops
    assert _dropped(backend) > 0


async def test_a_subscriber_that_leaves_releases_the_publisher(backend: Backend) -> None:
    consumer = await _subscribe(backend)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backend.publish_batch, _batch())
        await trio.sleep(STALL / 4)
        with trio.fail_after(STALL / 2):
            await consumer.close()
            nursery.cancel_scope.deadline = trio.current_time() + STALL / 2
    assert not nursery.cancel_scope.cancelled_caught


async def test_a_stalled_subscriber_that_takes_again_holds_publishers_back_again(
    backend: Backend,
) -> None:
    consumer = await _subscribe(backend)
    await backend.publish_batch(_batch())  # stalls
    await _take(consumer, 2)
    with trio.move_on_after(STALL / 2) as scope:
        await backend.publish_batch(_batch())
    assert scope.cancelled_caught  # waited for it again


async def test_a_publisher_does_not_wait_for_its_own_subscription(backend: Backend) -> None:
    # It would not read the acknowledgements its own subscriber waits for meanwhile.
    await backend.subscribe(spec(max_backlog=2, auto_ack_qos0=True, member="me"))
    own = [(T, Message(b"%d" % n, qos=0, producer="me")) for n in range(MESSAGES)]
    with trio.fail_after(STALL / 2):
        await backend.publish_batch(own)
    assert _dropped(backend) == MESSAGES - 2 - 2  # beyond the receive queue and the backlog


@pytest.mark.parametrize("backend_options", [{"receiver_queue": 2, "subscriber_max_bytes": 0}])
async def test_with_no_byte_bound_nobody_waits_and_the_backlog_rule_drops(
    backend: Backend,
) -> None:
    await _subscribe(backend)
    with trio.fail_after(STALL / 2):
        await backend.publish_batch(_batch())
    assert _dropped(backend) == MESSAGES - 2 - 2  # beyond the receive queue and the backlog
