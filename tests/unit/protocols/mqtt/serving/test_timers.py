"""Timers: deadline callbacks in one task, keyed by a name or by an object that is its own key
(a connection's keep-alive timer), rescheduled and cancelled by key (a virtual clock)."""

from __future__ import annotations

import trio

from mop.protocols.mqtt.serving.timers import Callback, Timers


class _Connection:
    """Hashed by identity, as the MQTT connection handler is."""


async def test_object_and_name_keys_fire_rescheduled_and_cancelled_apart(
    autojump_clock: trio.abc.Clock,
) -> None:
    timers = Timers()
    fired: list[tuple[str, float]] = []
    first, second = _Connection(), _Connection()

    def note(what: str) -> Callback:
        async def callback() -> None:
            fired.append((what, trio.current_time()))

        return callback

    async with trio.open_nursery() as nursery:
        await nursery.start(timers.serve)
        start = trio.current_time()
        timers.schedule(first, 2, note("first"))
        timers.schedule(second, 3, note("second"))
        timers.schedule("will:first", 1, note("name"))
        timers.schedule(first, 4, note("first again"))  # replaces its 2 s timer
        assert first in timers and second in timers
        assert timers.cancel(second)
        assert second not in timers and not timers.cancel(second)
        await trio.sleep(5)
        nursery.cancel_scope.cancel()

    assert [(what, round(at - start, 3)) for what, at in fired] == [
        ("name", 1.0),
        ("first again", 4.0),
    ]
    assert first not in timers
