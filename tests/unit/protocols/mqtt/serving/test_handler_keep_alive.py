"""Keep alive: a client that sends nothing for 1.5 times its keep alive is disconnected, and
only then; the check looks at when the read under way began to wait (a virtual clock)."""

from __future__ import annotations

import trio

from mop.protocols.mqtt.packets import Disconnect, Pingreq, Pingresp
from mop.protocols.mqtt.reason_codes import ReasonCode
from tests.unit.protocols.mqtt.serving.test_server import connect, mqtt_server


async def test_a_silent_client_is_disconnected_after_one_and_a_half_keep_alive(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with mqtt_server() as (server, nursery):
        peer, _ = await connect(server, nursery, "silent", keep_alive=2)
        start = trio.current_time()
        assert await peer.recv() == Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT)
        assert 3.0 <= trio.current_time() - start < 3.1
        assert await peer.recv() is None


async def test_a_client_that_sends_within_the_limit_stays_connected(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with mqtt_server() as (server, nursery):
        peer, _ = await connect(server, nursery, "pinger", keep_alive=2)
        # Each gap is just short of the limit, so every check finds a read that began to wait
        # less than 3 s ago and must look again later, not disconnect.
        for _ in range(6):
            await trio.sleep(2.9)
            await peer.send(Pingreq())
            assert await peer.recv() == Pingresp()
        start = trio.current_time()
        assert await peer.recv() == Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT)
        assert 3.0 <= trio.current_time() - start < 3.1


async def test_no_keep_alive_means_no_limit(autojump_clock: trio.abc.Clock) -> None:
    async with mqtt_server(max_keep_alive=65535) as (server, nursery):
        peer, _ = await connect(server, nursery, "forever", keep_alive=0)
        await trio.sleep(1000)
        await peer.send(Pingreq())  # answered, not a DISCONNECT or the end of the stream
        assert await peer.recv() == Pingresp()
