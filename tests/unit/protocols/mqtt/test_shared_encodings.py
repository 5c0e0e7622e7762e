from mop.message import Message
from mop.protocols.mqtt.codec import encode
from mop.protocols.mqtt.packets import Publish
from mop.protocols.mqtt.shared_encodings import SharedQos0Encodings


def test_a_message_shared_by_many_clients_is_encoded_once() -> None:
    encodings = SharedQos0Encodings()
    for _ in range(10_000):
        message = Message(b"payload", qos=0)
        first = encodings.encoded("a/b", message, False, 4)
        assert first == encode(Publish("a/b", b"payload"), 4)
        # Every other client at that level gets the same bytes object: no second encode.
        for _ in range(3):
            assert encodings.encoded("a/b", message, False, 4) is first


def test_messages_that_reach_one_client_each_are_encoded_without_the_cache() -> None:
    encodings = SharedQos0Encodings()
    # Once many lookups found nothing, the cache stands aside: a message asked for twice
    # is encoded twice (the same bytes, not the same object).
    for index in range(5_000):
        encodings.encoded("a/b", Message(b"%d" % index, qos=0), False, 4)
    message = Message(b"payload", qos=0)
    first = encodings.encoded("a/b", message, True, 4)
    second = encodings.encoded("a/b", message, True, 4)
    assert first == second == encode(Publish("a/b", b"payload", retain=True), 4)
    assert first is not second


def test_the_cache_comes_back_once_messages_are_shared_again() -> None:
    encodings = SharedQos0Encodings()
    for index in range(5_000):
        encodings.encoded("a/b", Message(b"%d" % index, qos=0), False, 4)
    shared = 0
    for index in range(100_000):
        message = Message(b"%d" % index, qos=0)
        first = encodings.encoded("a/b", message, False, 5)
        shared += encodings.encoded("a/b", message, False, 5) is first
        assert first == encode(Publish("a/b", b"%d" % index), 5)
    # Uncached for a bounded while, then cached again for the rest.
    assert shared > 100_000 // 2
    message = Message(b"payload", qos=0)
    assert encodings.encoded("a/b", message, False, 5) is encodings.encoded(
        "a/b", message, False, 5
    )
