"""Where a topic is, for one Pulsar connection: PARTITIONED_METADATA (how many partitions a
topic has) and LOOKUP (which broker, at which of its advertised listeners, serves it).

In a mop broker cluster the member that owns a topic's name knows both answers: it keeps the
partitioned metadata of the names it owns, and it knows its own listeners. Any other member
asks it over the peer link and passes its answer on, so a client may ask any member. A peer's
own request is answered from what this broker holds, so a request never travels further.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from mop.partitioned import partition_index
from mop.processor import BackendError
from mop.protocols.pulsar.commands import (
    Command,
    Lookup,
    LookupResponse,
    PartitionedMetadata,
    PartitionedMetadataResponse,
)
from mop.protocols.pulsar.connection import (
    lookup_connect,
    lookup_failed,
    lookup_redirect,
    partitioned_metadata,
    partitioned_metadata_failed,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.listeners import unknown_listener
from mop.protocols.pulsar.serving.peers import is_peer
from mop.protocols.pulsar.serving.server import TopicRefused, server_error
from mop.security.acl import Access

if TYPE_CHECKING:
    from mop.protocols.pulsar.serving.handler import PulsarConnection

__all__ = ["ConnectionLookups"]

log = logging.getLogger("mop.pulsar")

# The answers a member passes on from the owner of a topic.
_OwnersAnswer = TypeVar("_OwnersAnswer", LookupResponse, PartitionedMetadataResponse)


class ConnectionLookups:
    def __init__(self, link: PulsarConnection) -> None:
        self._link = link

    def _from_peer(self) -> bool:
        return is_peer(self._link.conn.client_version)

    # -- PARTITIONED_METADATA --------------------------------------------------------------

    def on_partitioned_metadata(self, cmd: PartitionedMetadata) -> None:
        link = self._link
        try:
            topic = link.authorized_topic(cmd.topic, Access.READ, Access.WRITE)
        except TopicRefused as exc:
            link.send(partitioned_metadata_failed(cmd.request_id, exc.error, exc.message))
            return
        if partition_index(topic) is not None:
            # A partition is a topic of its own, never partitioned itself.
            link.send(partitioned_metadata(cmd.request_id, 0))
            return
        # The backend (or a peer) may take a while: other commands go on meanwhile.
        link.nursery.start_soon(self._answer_partitions, cmd.request_id, topic)

    async def _answer_partitions(self, request_id: int, topic: str) -> None:
        link = self._link
        server = link.server
        owner = None if self._from_peer() else await server.owner(topic)
        if owner is not None:
            await self._pass_on_from_owner(
                request_id,
                topic,
                owner,
                lambda rid: PartitionedMetadata(topic=topic, request_id=rid),
                PartitionedMetadataResponse,
                partitioned_metadata_failed,
            )
            return
        try:
            count = await server.processor.partitioned.partitions(topic)
        except BackendError as exc:
            error = server_error(exc, ServerError.ServiceNotReady)
            link.send(partitioned_metadata_failed(request_id, error, str(exc)))
            return
        link.send(partitioned_metadata(request_id, count))

    # -- LOOKUP ----------------------------------------------------------------------------

    async def on_lookup(self, cmd: Lookup) -> None:
        link = self._link
        server = link.server
        try:
            topic = link.authorized_topic(cmd.topic, Access.READ, Access.WRITE)
        except TopicRefused as exc:
            link.send(lookup_failed(cmd.request_id, exc.error, exc.message))
            return
        # An authoritative lookup comes from a redirect: answering Connect ends the chain even
        # if this broker's member list disagrees with the one that redirected.
        owner = None if cmd.authoritative else await server.owner(topic)
        listener_name = cmd.advertised_listener_name or None
        if owner is None:
            link.send(self._connect(cmd.request_id, listener_name))
        elif listener_name is None:
            link.send(lookup_redirect(cmd.request_id, owner))
        else:
            # The owner alone knows its listeners: it is asked, which may take up to the
            # peer request timeout; the connection's other commands go on meanwhile.
            link.nursery.start_soon(
                self._answer_from_owner, cmd.request_id, topic, owner, listener_name
            )

    async def _answer_from_owner(
        self, request_id: int, topic: str, owner: str, listener_name: str
    ) -> None:
        """Pass on the owner's answer to a lookup naming a listener."""
        await self._pass_on_from_owner(
            request_id,
            topic,
            owner,
            lambda rid: Lookup(
                topic=topic,
                request_id=rid,
                authoritative=True,
                advertised_listener_name=listener_name,
            ),
            LookupResponse,
            lookup_failed,
        )

    async def _pass_on_from_owner(
        self,
        request_id: int,
        topic: str,
        owner: str,
        question: Callable[[int], Command],
        answer_type: type[_OwnersAnswer],
        failed: Callable[[int, ServerError, str], _OwnersAnswer],
    ) -> None:
        """Send the client the owner's answer to `question` (under the client's request id),
        or `failed` when the owner cannot be asked now."""
        link = self._link
        answer = await link.server.peers.ask(owner, question)
        if isinstance(answer, answer_type):
            link.send(dataclasses.replace(answer, request_id=request_id))
        else:
            why = f"the owner of {topic} ({owner}) cannot be asked now"
            link.send(failed(request_id, ServerError.ServiceNotReady, why))

    def _connect(self, request_id: int, listener_name: str | None) -> LookupResponse:
        """This broker serves the topic: at the listener the lookup names, else at the one
        the client came in on."""
        link = self._link
        server = link.server
        if listener_name is None:
            return lookup_connect(
                request_id,
                server.service_url(link.info),
                broker_url_tls=server.service_url_tls(link.info),
            )
        listener = server.listeners.get(listener_name)
        if listener is None:
            log.debug("%s: lookup names unknown listener %r", link.ctx.peer, listener_name)
            return lookup_failed(
                request_id, ServerError.NotAllowedError, unknown_listener(listener_name)
            )
        return lookup_connect(request_id, listener.url, broker_url_tls=listener.url_tls)
