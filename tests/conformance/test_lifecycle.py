"""A backend's life: what it says about topics and owners while it runs, and what it refuses
once it is closed."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mop.message import Message
from mop.processor import ClientContext, MessagingProcessor
from mop.processor.backend import Backend, BackendError, ConsumerClosed, SubscriptionSpec
from tests.conformance.harness import DEADLINE, Deployment, Names


async def test_lookup_names_a_pulsar_service(backend: Backend, names: Names) -> None:
    url = await backend.lookup(names.topic("t"))
    assert url.startswith("pulsar://")


async def test_topics_lists_the_topics_of_a_namespace(backend: Backend, names: Names) -> None:
    await backend.publish(names.topic("a"), Message(b"", qos=1))
    await backend.publish(names.topic("b/c"), Message(b"", qos=1))
    listed = await backend.topics("public/default")
    assert {names.topic("a"), names.topic("b/c")} <= set(listed)


async def test_a_closed_backend_wakes_its_consumers_and_refuses_calls(
    deployment: Deployment, names: Names
) -> None:
    async with deployment.open_backend() as backend:
        consumer = await backend.subscribe(
            SubscriptionSpec(name=names.sub("s"), selectors=frozenset([names.mqtt("t")]))
        )
        lease = await backend.open_client(names.sub("client"))
        woken = trio.Event()

        async def wait() -> None:
            with pytest.raises(ConsumerClosed):
                await consumer.receive(1)
            woken.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            await backend.aclose()
            with trio.fail_after(DEADLINE):
                await woken.wait()
        with trio.fail_after(DEADLINE):
            await lease.wait_fenced()
        with pytest.raises(BackendError):
            await backend.publish(names.topic("t"), Message(b"late", qos=1))
        with pytest.raises(BackendError):
            await backend.publish(names.topic("t"), Message(b"late", qos=0))
        # The processor's batch path answers per message rather than raising.
        late = [(names.topic("t"), Message(b"late", qos=qos)) for qos in (0, 1)]
        results = await MessagingProcessor(backend).publish_batch(ClientContext("c", "mqtt"), late)
        assert len(results) == 2
        assert all(isinstance(result, BackendError) for result in results), results
        with pytest.raises(BackendError):
            await backend.subscribe(
                SubscriptionSpec(name=names.sub("s2"), selectors=frozenset([names.mqtt("t")]))
            )
