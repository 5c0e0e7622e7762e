"""How a CONNECT refused after the client id was taken is counted: refused only (never opened
nor closed), with the client id given up so that the client can connect again."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mop.broker.storage.memory import MemoryStorage
from mop.message import Message
from mop.messaging import BackendError
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.protocols.mqtt.serving.session_registry import SessionRegistry

from .test_handler import connect, connect_answer, mqtt_server


@pytest.mark.parametrize("failing", ["take", "attach"])
@pytest.mark.parametrize("level", [5, 4])
async def test_a_session_that_cannot_be_read_or_stored_refuses_as_unavailable(
    failing: str, level: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = getattr(SessionRegistry, failing)
    fail = [True]

    async def flaky(self: SessionRegistry, *args: object, **kwargs: object) -> object:
        if fail[0]:
            fail[0] = False
            raise BackendError("unreachable")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SessionRegistry, failing, flaky)
    async with mqtt_server(MemoryStorage()) as (server, nursery):
        _, answer = await connect_answer(server, nursery, "c", level)
        if failing == "take":
            assert answer.reason_code == (ReasonCode.SERVER_UNAVAILABLE if level == 5 else 3)
        else:  # as the backend's error says (here: none in particular)
            assert answer.reason_code == (ReasonCode.UNSPECIFIED_ERROR if level == 5 else 3)
        await trio.testing.wait_all_tasks_blocked()
        stats = server.processor.stats.protocol("mqtt")
        assert stats.connections == 0
        assert stats.opened == 0
        assert stats.closed == {}
        assert stats.refused == {"unavailable": 1}
        # The client id was given up: the same client connects at once.
        with trio.fail_after(5):
            await connect(server, nursery, "c", level)
        assert (stats.connections, stats.opened) == (1, 1)


async def test_the_retained_messages_counted_are_not_the_nodes_own() -> None:
    async with mqtt_server(MemoryStorage()) as (server, _nursery):
        server.retained.keep_local("$SYS/broker/uptime", Message(b"1 seconds"))
        await server.retained.set("a", Message(b"kept"))
        assert server.counts().retained == 1
