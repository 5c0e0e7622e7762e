"""What Pulsar clients are told for a connection over the connection rate."""

from __future__ import annotations

from mop.protocols.pulsar.commands import Error
from mop.protocols.pulsar.connection import NO_REQUEST_ID
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import FrameDecoder, NeedData
from mop.protocols.pulsar.overload import rate_refusal


def test_a_refused_connection_gets_too_many_requests() -> None:
    decoder = FrameDecoder()
    decoder.feed(rate_refusal(b"whatever came first"))
    frame = decoder.next_frame()
    assert isinstance(frame, Error)
    assert frame.error is ServerError.TooManyRequests
    assert frame.request_id == NO_REQUEST_ID
    assert "limits.connection_rate" in frame.message
    assert isinstance(decoder.next_frame(), NeedData)
