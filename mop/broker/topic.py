"""Topics as the broker holds them: a name, its MQTT form, its last id and the cursors of the
subscriptions attached to it. `Entry` is a stored message as it travels through dispatch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from mop.message import Message, MessageId

if TYPE_CHECKING:
    from mop.broker.subscription import Cursor

__all__ = ["Entry", "Topic"]


class Entry(NamedTuple):
    """One message of one topic; created once per publish and shared by every subscription."""

    topic: str
    message_id: MessageId
    message: Message


class Topic:
    __slots__ = ("cursors", "last_id", "mqtt", "name", "trimmed")

    def __init__(self, name: str, mqtt: str, last_id: MessageId | None) -> None:
        self.name = name
        self.mqtt = mqtt
        self.last_id = last_id
        # What publish walks: one cursor per attached subscription, kept up to date when
        # subscriptions or selectors change so that a publish never searches for them.
        self.cursors: list[Cursor] = []
        self.trimmed: MessageId | None = None

    def __repr__(self) -> str:
        return f"Topic({self.name!r})"
