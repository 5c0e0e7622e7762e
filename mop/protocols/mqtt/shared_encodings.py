"""`SharedQos0Encodings`: the bytes of a QoS 0 PUBLISH without properties, encoded once for
every client that gets the same message at the same protocol level.

A message fanned out to many clients is then encoded once. A message that reaches one client
only (many publishers to one subscriber, or every client on a topic of its own) would pay for a
cache entry it never uses, one per message: so the cache watches how often it is used, and
while a sample of lookups finds almost none, it stands aside for a while and encodes directly.
The bytes are the same either way; only the work differs.
"""

from __future__ import annotations

from mop.message import Message
from mop.protocols.mqtt.encoder import encode_publish
from mop.protocols.mqtt.packets import NO_PROPERTIES

__all__ = ["SharedQos0Encodings"]

# Bounds of the memory of encoded PUBLISHes: it only needs to outlive one fan-out.
_MAX_ENTRIES = 4096
_MAX_BYTES = 8 << 20
# Lookups judged at a time: as many as the cache holds, since an entry is not kept for longer.
_SAMPLE = _MAX_ENTRIES
# A sample with fewer hits than one in this many lookups means hardly any message is shared.
_MIN_HIT_SHARE = 8
# Encodes done without the cache after such a sample, before another is taken (so that a
# fan-out that starts meanwhile goes uncached for a bounded while only).
_STAND_ASIDE = 15 * _SAMPLE


class SharedQos0Encodings:
    __slots__ = ("_bytes", "_entries", "_hits", "_lookups", "_standing_aside")

    def __init__(self) -> None:
        # By (message id, topic, retain, protocol level); the message is kept with its bytes,
        # as its id identifies it only while it lives.
        self._entries: dict[tuple[int, str, bool, int], tuple[Message, bytes]] = {}
        self._bytes = 0
        self._lookups = 0
        self._hits = 0
        self._standing_aside = 0  # encodes left to do without the cache

    def encoded(self, topic: str, message: Message, retain: bool, level: int) -> bytes:
        """The QoS 0 PUBLISH of `message` on `topic`, without properties, at protocol
        `level`."""
        if self._standing_aside:
            self._standing_aside -= 1
            return _encode(topic, message, retain, level)
        key = (id(message), topic, retain, level)
        hit = self._entries.get(key)
        self._lookups += 1
        if hit is not None and hit[0] is message:  # the id is only valid with the object
            self._hits += 1
            return hit[1]
        data = _encode(topic, message, retain, level)
        if self._lookups >= _SAMPLE:
            shared = self._hits * _MIN_HIT_SHARE >= self._lookups
            self._lookups = self._hits = 0
            if not shared:
                self._standing_aside = _STAND_ASIDE
                self._clear()
                return data
        if self._bytes > _MAX_BYTES or len(self._entries) >= _MAX_ENTRIES:
            self._clear()
        self._entries[key] = (message, data)
        self._bytes += len(data)
        return data

    def _clear(self) -> None:
        self._entries.clear()
        self._bytes = 0


def _encode(topic: str, message: Message, retain: bool, level: int) -> bytes:
    return encode_publish(
        topic,
        message.payload,
        qos=0,
        retain=retain,
        dup=False,
        packet_id=None,
        properties=NO_PROPERTIES,
        protocol_level=level,
    )
