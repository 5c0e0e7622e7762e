"""Each PulsarGrpcService call is one client of the processor: authenticated from its metadata
(and client certificate), admitted under the node's connection limit, counted as a "grpc"
connection, and authorized per topic by the ACL. A call whose credential expires (a token's
`exp`) ends with UNAUTHENTICATED then, as a Pulsar connection that cannot refresh it closes:
a gRPC call has no way to be given a new one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from mop.counters import Closing, Refusal, refusal_of
from mop.processor import (
    BackendError,
    ClientContext,
    ConnectionLimitReached,
    MessagingProcessor,
)
from mop.protocols.grpc.authentication import call_credentials, certificate_of
from mop.protocols.grpc.errors import backend_status, refused_status
from mop.protocols.grpc.mapping import canonical_topic
from mop.protocols.grpc.metadata import authorization
from mop.protocols.grpc.serving.calls import Call
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.protocols.pulsar.authentication import may_use_system_topics
from mop.security.acl import Access
from mop.security.authorization import ClientPermissions
from mop.security.identity import AuthenticationError
from mop.topic_names import is_system_topic, pulsar_to_mqtt

log = logging.getLogger("mop.grpc")

PROTOCOL = "grpc"


@dataclass(frozen=True, slots=True)
class Namespaces:
    """Where short topic names live, and whose tenant the node serves."""

    tenant: str
    namespace: str


@dataclass(frozen=True, slots=True)
class CallClient:
    """The client a call is, once admitted: who it is and what it may do."""

    ctx: ClientContext
    permissions: ClientPermissions
    namespaces: Namespaces

    def topic(self, name: str, access: Access) -> str:
        """The full name of topic `name` when this client may use it for `access`; else
        INVALID_ARGUMENT / NOT_FOUND (a name the node does not serve, one of the deployment's
        own topics) or PERMISSION_DENIED (the ACL)."""
        tenant, namespace = self.namespaces.tenant, self.namespaces.namespace
        topic = canonical_topic(name, tenant=tenant, namespace=namespace)
        if is_system_topic(topic, tenant) and not may_use_system_topics(
            self.ctx.principal, restricted=self.permissions.restricted
        ):
            raise GrpcError(
                StatusCode.INVALID_ARGUMENT, f"{topic} is one of the deployment's own topics"
            )
        acl_topic = pulsar_to_mqtt(topic, tenant=tenant, namespace=namespace)
        if not self.permissions.may(access, acl_topic):
            raise GrpcError(
                StatusCode.PERMISSION_DENIED,
                f"{self.ctx.principal.display!r} is not authorized to {access.value} {topic}",
            )
        return topic


def _address(peer: str) -> str:
    """The host of "host:port" (and of "[v6]:port")."""
    host = peer.rpartition(":")[0] or peer
    return host.removeprefix("[").removesuffix("]")


@asynccontextmanager
async def open_call_client(
    processor: MessagingProcessor, namespaces: Namespaces, call: Call
) -> AsyncIterator[CallClient]:
    """Authenticate and admit the client of `call` for as long as the block runs.

    UNAUTHENTICATED (PERMISSION_DENIED for a ban) when its credentials prove nobody the node
    lets in, RESOURCE_EXHAUSTED when the node serves its maximum of clients."""
    stats = processor.stats.protocol(PROTOCOL)
    ctx = ClientContext(client_id=f"grpc/{uuid.uuid4().hex}", protocol=PROTOCOL, peer=call.peer)
    try:
        credentials = call_credentials(
            authorization(call.metadata),
            client_id=ctx.client_id,
            address=_address(call.peer),
            certificate=certificate_of(call.peer_certificate),
        )
        principal = processor.authenticate(credentials)
    except AuthenticationError as exc:
        log.info("%s: authentication refused: %s", call.peer, exc.why)
        stats.refuse(refusal_of(exc.failure))
        raise refused_status(exc) from None
    ctx = dataclasses.replace(ctx, username=credentials.username, principal=principal)
    try:
        lease = await processor.open_client(ctx)
    except ConnectionLimitReached as exc:
        stats.refuse(Refusal.LIMIT_REACHED)
        raise GrpcError(StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None
    except BackendError as exc:  # a separated proxy that cannot reach its brokers, say
        stats.refuse(Refusal.UNAVAILABLE)
        raise backend_status(exc) from None
    expired = False
    ended: GrpcError | None = None
    try:
        async with trio.open_nursery() as nursery:
            if principal.expires_at is not None:

                async def watch_credential() -> None:
                    nonlocal expired
                    await _until_expired(processor, ctx)
                    log.info("%s: the credential of %s expired", call.peer, principal.display)
                    expired = True
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch_credential)
            try:
                yield CallClient(ctx, processor.permissions(ctx), namespaces)
            except GrpcError as exc:
                ended = exc  # raised below, alone: not in the nursery's exception group
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            closing = Closing.NOT_AUTHORIZED if expired else Closing.NORMAL
            await processor.close_client(ctx, lease, closing)
    if expired:
        raise GrpcError(StatusCode.UNAUTHENTICATED, "the credential expired")
    if ended is not None:
        raise ended


async def _until_expired(processor: MessagingProcessor, ctx: ClientContext) -> None:
    """Return once the credential `ctx` was admitted with no longer holds."""
    expires_at = ctx.principal.expires_at
    assert expires_at is not None
    while True:
        # The processor allows some leeway past `expires_at`: ask it again once there.
        await trio.sleep(max(0.05, expires_at - time.time()))
        if not processor.credential_valid(ctx):
            return


__all__ = ["PROTOCOL", "CallClient", "Namespaces", "open_call_client"]
