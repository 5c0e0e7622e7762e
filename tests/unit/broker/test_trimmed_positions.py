"""The last readable message of a topic (what Pulsar's GET_LAST_MESSAGE_ID answers) once its
messages are trimmed: acknowledged by every subscription, or dropped by retention."""

from __future__ import annotations

from mop.broker.storage import MemoryStorage
from mop.message import Message, MessageId

from .support import msg, new_broker, payloads, subscribe, take_all, topic

T = topic("trimmed")


async def test_the_last_message_of_a_fully_acknowledged_and_trimmed_topic_is_none() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    ids = [(await broker.publish(T, msg(str(i)))).message_id for i in range(3)]
    assert (await broker.position(att.sub, T)) == (ids[-1], None)
    broker.ack(att, take_all(broker, att))
    assert broker.trim_acknowledged() == 1
    # Nothing is left to read: an id here would have readers wait for a trimmed message.
    assert (await broker.position(att.sub, T)) == (None, ids[-1])


async def test_a_topic_trimmed_behind_the_brokers_back_has_no_last_message() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [T])
    last = (await broker.publish(T, msg("kept by nobody"))).message_id
    storage.trim(T, last)  # as retention does, whatever the cursors say
    assert (await broker.position(att.sub, T))[0] is None


async def test_a_message_after_the_trim_is_the_last_one_again() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    await broker.publish(T, msg("old"))
    broker.ack(att, take_all(broker, att))
    broker.trim_acknowledged()
    batch = Message(b"", batch=(Message(b"a"), Message(b"b")))
    new = (await broker.publish(T, batch)).message_id
    last, _ = await broker.position(att.sub, T)
    assert last == MessageId(new.ledger, new.entry, 1)  # its last message in the batch
    assert payloads(take_all(broker, att)) == ["a", "b"]


async def test_a_partly_trimmed_topic_keeps_its_last_message() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [T])
    ids = [(await broker.publish(T, msg(str(i)))).message_id for i in range(3)]
    storage.trim(T, ids[1])
    assert (await broker.position(att.sub, T))[0] == ids[2]
