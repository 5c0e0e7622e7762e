"""Broker positions (start ids, resets by id and by publish time, the last id and the mark-delete
position, topics of a namespace), with plain calls; and the last readable message of a topic
(what Pulsar's GET_LAST_MESSAGE_ID answers) once its messages are trimmed: acknowledged by every
subscription, or dropped by retention."""

from __future__ import annotations

from mop.broker import id_before
from mop.broker.storage import MemoryStorage
from mop.message import Message, MessageId

from .support import msg, new_broker, payloads, subscribe, take_all, topic

T = topic("t")


async def publish_times(broker: object, *times: int) -> list[MessageId]:
    from mop.broker import Broker

    assert isinstance(broker, Broker)
    return [
        (await broker.publish(T, Message(f"m{t}".encode(), publish_time=t))).message_id
        for t in times
    ]


def test_id_before() -> None:
    assert id_before(MessageId(3, 5)) == MessageId(3, 4)
    assert id_before(MessageId(3, 5, 2)) == MessageId(3, 4)
    before_ledger = id_before(MessageId(3, 0))
    assert before_ledger is not None and before_ledger < MessageId(3, 0)
    assert before_ledger > MessageId(2, 1_000_000)
    assert id_before(MessageId(0, 0)) is None


async def test_a_new_subscription_can_start_at_an_id() -> None:
    broker = new_broker()
    await subscribe(broker, "keeper", [T])
    ids = await publish_times(broker, 1, 2, 3)
    att = await subscribe(broker, "s", [T], start_at=ids[1], durable=False)
    assert payloads(take_all(broker, att)) == ["m2", "m3"]


async def test_reset_to_an_id_forgets_later_acks_and_withdraws_deliveries() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    ids = await publish_times(broker, 1, 2, 3)
    broker.ack(att, take_all(broker, att))
    await broker.reset(att.sub, T, message_id=ids[1])
    again = take_all(broker, att)
    assert payloads(again) == ["m2", "m3"]
    assert [d.redelivery_count for d in again] == [0, 0]
    await broker.reset(att.sub, T)  # neither id nor time: the first stored message
    assert payloads(take_all(broker, att)) == ["m1", "m2", "m3"]


async def test_reset_by_publish_time() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    await publish_times(broker, 10, 20, 30)
    take_all(broker, att)
    await broker.reset(att.sub, T, publish_time=15)
    assert payloads(take_all(broker, att)) == ["m20", "m30"]
    await broker.reset(att.sub, T, publish_time=99)
    assert take_all(broker, att) == []


async def test_a_reset_survives_a_restart_for_durable_subscriptions() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [T])
    ids = await publish_times(broker, 1, 2, 3)
    broker.ack(att, take_all(broker, att))
    await broker.reset(att.sub, T, message_id=ids[2])
    broker.close(att)
    restarted = new_broker(storage)
    await restarted.recover()
    again = await subscribe(restarted, "s", [T])
    assert payloads(take_all(restarted, again)) == ["m3"]


async def test_position_reports_the_last_batch_message_and_the_mark() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [T])
    assert await broker.position(att.sub, T) == (None, None)
    first = (await broker.publish(T, msg("x"))).message_id
    entry = (await broker.publish(T, Message(b"", batch=(Message(b"a"), Message(b"b"))))).message_id
    broker.ack(att, take_all(broker, att)[:1])
    last, mark = await broker.position(att.sub, T)
    assert (last, mark) == (MessageId(entry.ledger, entry.entry, 1), first)
    restarted = new_broker(storage)  # the batch size is read back from storage
    await restarted.recover()
    again = await subscribe(restarted, "s", [T])
    assert (await restarted.position(again.sub, T))[0] == MessageId(entry.ledger, entry.entry, 1)


async def test_topics_of_a_namespace() -> None:
    broker = new_broker()
    await broker.publish(T, msg("x"))
    await broker.publish("persistent://public/other/y", msg("y"))
    await subscribe(broker, "np", ["non-persistent://public/default/z"], durable=False)
    assert sorted(broker.topics("public/default")) == ["non-persistent://public/default/z", T]
    assert broker.topics("public/other") == ["persistent://public/other/y"]


# -- producers ------------------------------------------------------------------------------


TRIMMED = topic("trimmed")


async def test_the_last_message_of_a_fully_acknowledged_and_trimmed_topic_is_none() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [TRIMMED])
    ids = [(await broker.publish(TRIMMED, msg(str(i)))).message_id for i in range(3)]
    assert (await broker.position(att.sub, TRIMMED)) == (ids[-1], None)
    broker.ack(att, take_all(broker, att))
    assert broker.trim_acknowledged() == 1
    # Nothing is left to read: an id here would have readers wait for a trimmed message.
    assert (await broker.position(att.sub, TRIMMED)) == (None, ids[-1])


async def test_a_topic_trimmed_behind_the_brokers_back_has_no_last_message() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [TRIMMED])
    last = (await broker.publish(TRIMMED, msg("kept by nobody"))).message_id
    storage.trim(TRIMMED, last)  # as retention does, whatever the cursors say
    assert (await broker.position(att.sub, TRIMMED))[0] is None


async def test_a_message_after_the_trim_is_the_last_one_again() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [TRIMMED])
    await broker.publish(TRIMMED, msg("old"))
    broker.ack(att, take_all(broker, att))
    broker.trim_acknowledged()
    batch = Message(b"", batch=(Message(b"a"), Message(b"b")))
    new = (await broker.publish(TRIMMED, batch)).message_id
    last, _ = await broker.position(att.sub, TRIMMED)
    assert last == MessageId(new.ledger, new.entry, 1)  # its last message in the batch
    assert payloads(take_all(broker, att)) == ["a", "b"]


async def test_a_partly_trimmed_topic_keeps_its_last_message() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [TRIMMED])
    ids = [(await broker.publish(TRIMMED, msg(str(i)))).message_id for i in range(3)]
    storage.trim(TRIMMED, ids[1])
    assert (await broker.position(att.sub, TRIMMED))[0] == ids[2]
