"""The PulsarGrpcService handlers against an in-process merged processor, through an in-memory
call: requests and responses are memory channels, and a response channel without a buffer is
a client that reads only when the test does (a closed HTTP/2 window)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio

from mop.backends.local import open_local_backend
from mop.broker.storage import MemoryStorage
from mop.processor import MessagingProcessor
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.pulsar_service import pulsar_methods
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.settings import Settings


class FakeCall:
    """A call as the server hands it to a handler: requests the test sends (None once it
    half-closes) and responses it reads."""

    def __init__(
        self,
        method: str,
        metadata: dict[str, str] | tuple[tuple[str, str], ...],
        *,
        window: float = math.inf,
        peer: str = "127.0.0.1:40000",
        peer_certificate: bytes | None = None,
    ) -> None:
        self.method = method
        self.metadata = tuple(metadata.items()) if isinstance(metadata, dict) else metadata
        self.peer = peer
        self.peer_certificate = peer_certificate
        self._requests, self._taken = trio.open_memory_channel[bytes](math.inf)
        self._responses, self.responses = trio.open_memory_channel[bytes](window)
        # Requests the handler has asked for so far.
        self.received = 0
        self.status: StatusCode | None = None
        self.message = ""
        # Set once the handler has ended (with `status`).
        self.done = trio.Event()

    # -- the handler's side ----------------------------------------------------------------

    async def receive(self) -> bytes | None:
        try:
            data = await self._taken.receive()
        except trio.EndOfChannel:
            return None
        self.received += 1
        return data

    async def send(self, message: bytes) -> None:
        await self._responses.send(message)

    # -- the client's side -----------------------------------------------------------------

    def request(self, message: Any) -> None:
        self._requests.send_nowait(message.SerializeToString())

    def raw_request(self, data: bytes) -> None:
        self._requests.send_nowait(data)

    def half_close(self) -> None:
        self._requests.close()

    async def response(self, kind: Callable[[], Any]) -> Any:
        with trio.fail_after(5):
            data = await self.responses.receive()
        message = kind()
        message.ParseFromString(data)
        return message

    async def run(self, handler: MethodHandler) -> None:
        """Serve the call to its end; the status it ends with is kept."""
        try:
            await handler(self)
        except GrpcError as exc:
            self.status, self.message = exc.code, exc.message
        else:
            self.status = StatusCode.OK
        finally:
            self._responses.close()
            self.done.set()


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture
def processor_options() -> dict[str, Any]:
    return {}


@pytest.fixture
async def processor(processor_options: dict[str, Any]) -> AsyncIterator[MessagingProcessor]:
    async with open_local_backend(MemoryStorage(), fence_timeout=2.0) as backend:
        yield MessagingProcessor(backend, **processor_options)


@pytest.fixture
def methods(processor: MessagingProcessor, settings: Settings) -> dict[str, MethodHandler]:
    return pulsar_methods(processor, settings)
