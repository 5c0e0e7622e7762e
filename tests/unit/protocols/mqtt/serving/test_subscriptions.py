"""A session's consumers as its connection ends (`SessionSubscriptions.detach`)."""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio

from mop.processor import BackendError, ClientContext
from mop.protocols.mqtt.serving.subscriptions import SessionSubscriptions
from mop.protocols.mqtt.session import SessionState
from mop.security.gatekeeper import Gatekeeper
from mop.security.identity import ANONYMOUS


class FakeConsumer:
    """Records how it was let go of; `fails` raises a BackendError instead."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.left: list[str] = []

    async def close(self) -> None:
        await self._leave("closed")

    async def unsubscribe(self) -> None:
        await self._leave("unsubscribed")

    async def _leave(self, how: str) -> None:
        await trio.lowlevel.checkpoint()
        if self.fails:
            raise BackendError("the brokers cannot be reached", reason="unavailable")
        self.left.append(how)


@pytest.mark.parametrize("unsubscribe", [False, True])
async def test_every_consumer_is_let_go_of_even_when_one_cannot_be(unsubscribe: bool) -> None:
    subs = SessionSubscriptions(
        cast(Any, None),
        ClientContext("c", "mqtt"),
        SessionState(client_id="c"),
        Gatekeeper().permissions(ANONYMOUS, "c", ""),
    )
    failing, shared, normal = FakeConsumer(fails=True), FakeConsumer(), FakeConsumer()
    subs._shared = {
        "$share/g/a": (cast(Any, failing), trio.CancelScope()),
        "$share/g/b": (cast(Any, shared), trio.CancelScope()),
    }
    subs._normal = cast(Any, normal)
    with pytest.raises(BackendError, match="cannot be reached"):
        await subs.detach(unsubscribe=unsubscribe)
    how = "unsubscribed" if unsubscribe else "closed"
    assert shared.left == [how] and normal.left == [how]
