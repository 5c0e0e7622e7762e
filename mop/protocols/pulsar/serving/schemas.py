"""The schema commands of one Pulsar connection (GET_SCHEMA, GET_OR_CREATE_SCHEMA), and the
schema a producer or consumer brings, registered or found through the processor.

The partitions of a topic share one schema, kept by the cluster member that owns the topic's
name (persistent, without a partition suffix): a member that serves a partition asks that
owner over the peer links, with the same commands. A peer's request is answered from this
broker's own registry, so a request never goes further.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import trio

from mop.processor import Access, BackendError
from mop.protocols.pulsar.commands import (
    GetOrCreateSchema,
    GetOrCreateSchemaResponse,
    GetSchema,
    GetSchemaResponse,
    Schema,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.schemas import (
    schema_info,
    schema_message,
    version_bytes,
    version_number,
)
from mop.protocols.pulsar.serving.peers import is_peer
from mop.protocols.pulsar.serving.server import TopicRefused, server_error
from mop.schemas import IncompatibleSchema, SchemaInfo, StoredSchema, namespace_of, schema_name
from mop.schemas.compatibility import reader_incompatibility

if TYPE_CHECKING:
    from mop.protocols.pulsar.serving.handler import PulsarConnection

__all__ = ["ConnectionSchemas"]

log = logging.getLogger("mop.pulsar")

# Consumers' schemas compared at once, in worker threads (comparing large Avro definitions is
# slow: it must not hold up the event loop).
_READER_CHECKS: Final = trio.CapacityLimiter(2)


class ConnectionSchemas:
    """The schema requests of one connection, answered through the processor (the broker
    that owns a topic keeps its schemas)."""

    def __init__(self, link: PulsarConnection) -> None:
        self._link = link

    async def version_for(self, topic: str, schema: Schema | None) -> bytes | None:
        """The version of the schema a producer of `topic` brings (or GET_OR_CREATE_SCHEMA
        names), registered when new; None when it brings none. Raises BackendError
        (IncompatibleSchema) when the namespace's rule refuses it."""
        if schema is None:
            return None
        info = schema_info(schema)
        if not info.kind.registered:
            return None
        return version_bytes(await self._register(topic, info))

    async def _busy(self, topic: str) -> bool:
        """Whether `topic` has data, producers or consumers (Pulsar adds a consumer's schema
        only to a topic with none). A broker that cannot tell (a separated proxy without the
        brokers' admin API) takes the topic as idle."""
        try:
            stats = await self._link.server.processor.topic_stats(topic)
        except BackendError:
            return False
        if stats is None:
            return False
        return bool(
            stats.producers or stats.consumers or stats.storage_size or stats.inbound.messages
        )

    async def _keeper(self, topic: str) -> tuple[str, str | None]:
        """The topic whose owner keeps `topic`'s schema, and that owner's URL (None: this
        broker)."""
        if is_peer(self._link.conn.client_version):
            return topic, None
        keeper = f"persistent://{schema_name(topic)}"
        return keeper, await self._link.server.owner(keeper)

    async def _stored(self, topic: str, version: int | None) -> StoredSchema | None:
        """Version `version` (None: the latest) of `topic`'s schema, wherever it is kept."""
        keeper, owner = await self._keeper(topic)
        server = self._link.server
        if owner is None:
            return await server.processor.schema(topic, version)
        wanted = None if version is None else version_bytes(version)
        answer = await server.peers.ask(
            owner, lambda rid: GetSchema(request_id=rid, topic=keeper, schema_version=wanted)
        )
        if not isinstance(answer, GetSchemaResponse):
            raise _unreachable(keeper, owner)
        if answer.error_code is ServerError.TopicNotFound:
            return None
        if answer.error_code is not None or answer.schema is None:
            raise BackendError(f"{owner}: {answer.error_message}", reason="bad_answer")
        return StoredSchema(
            version_number(answer.schema_version or b""), schema_info(answer.schema)
        )

    async def _register(self, topic: str, info: SchemaInfo) -> int:
        """The version of `info` among `topic`'s schemas (added when new), wherever it is kept."""
        keeper, owner = await self._keeper(topic)
        server = self._link.server
        if owner is None:
            return await server.processor.get_or_create_schema(topic, info)
        schema = schema_message(StoredSchema(0, info))
        answer = await server.peers.ask(
            owner, lambda rid: GetOrCreateSchema(request_id=rid, topic=keeper, schema=schema)
        )
        if not isinstance(answer, GetOrCreateSchemaResponse):
            raise _unreachable(keeper, owner)
        if answer.error_code is ServerError.IncompatibleSchema:
            raise IncompatibleSchema(answer.error_message or f"{keeper}: incompatible schema")
        if answer.error_code is not None:
            raise BackendError(f"{owner}: {answer.error_message}", reason="bad_answer")
        return _version(owner, answer.schema_version)

    async def check_consumer(self, topic: str, schema: Schema | None) -> None:
        """Check the schema a consumer of `topic` brings, as Pulsar brokers do: on an idle topic
        without a schema (no data, producers or consumers) it becomes the first version, on a
        busy one it is refused ("Topic does not have schema to check"); on a topic with a
        schema it must be one of its versions or read them (`reader_incompatibility`), and is
        not added. Raises BackendError (IncompatibleSchema) when it may not."""
        if schema is None:
            return
        info = schema_info(schema)
        if not info.kind.registered:
            return
        limit = self._link.server.settings.pulsar.schema_max_bytes
        if len(info.data) > limit:
            raise IncompatibleSchema(
                f"the schema definition is {len(info.data)} bytes, more than the "
                f"{limit} this broker accepts (pulsar.schema_max_bytes)"
            )
        processor = self._link.server.processor
        latest = await self._stored(topic, None)
        if latest is None:
            if await self._busy(topic):
                raise IncompatibleSchema(
                    f"{schema_name(topic)}: Topic does not have schema to check"
                    " (it has data, producers or consumers)"
                )
            await self._register(topic, info)
            return
        versions = [latest.info]
        for version in range(latest.version - 1, -1, -1):
            stored = await self._stored(topic, version)
            if stored is not None:
                versions.insert(0, stored.info)
        rule = await processor.schema_compatibility(namespace_of(topic))
        reason = await trio.to_thread.run_sync(
            reader_incompatibility,
            versions,
            info,
            rule,
            limiter=_READER_CHECKS,
            abandon_on_cancel=True,
        )
        if reason is not None:
            raise IncompatibleSchema(f"{schema_name(topic)}: {reason}")

    async def on_get_schema(self, cmd: GetSchema) -> None:
        link = self._link
        rid = cmd.request_id
        try:
            topic = link.authorized_topic(cmd.topic, Access.READ, Access.WRITE)
            version = None if cmd.schema_version is None else version_number(cmd.schema_version)
            if (owner := await link.server.owner(topic)) is not None:
                raise TopicRefused(ServerError.ServiceNotReady, f"{topic} is served by {owner}")
            stored = await self._stored(topic, version)
        except TopicRefused as exc:
            link.send(
                GetSchemaResponse(request_id=rid, error_code=exc.error, error_message=exc.message)
            )
            return
        except ValueError as exc:
            link.send(
                GetSchemaResponse(
                    request_id=rid, error_code=ServerError.UnknownError, error_message=str(exc)
                )
            )
            return
        except BackendError as exc:
            link.send(
                GetSchemaResponse(
                    request_id=rid, error_code=server_error(exc), error_message=str(exc)
                )
            )
            return
        if stored is None:
            # What Pulsar brokers answer for a topic without (that version of) a schema.
            link.send(
                GetSchemaResponse(
                    request_id=rid,
                    error_code=ServerError.TopicNotFound,
                    error_message="Topic not found or no-schema",
                )
            )
            return
        link.send(
            GetSchemaResponse(
                request_id=rid,
                schema=schema_message(stored),
                schema_version=version_bytes(stored.version),
            )
        )

    async def on_get_or_create_schema(self, cmd: GetOrCreateSchema) -> None:
        link = self._link
        rid = cmd.request_id
        try:
            topic = link.authorized_topic(cmd.topic, Access.WRITE)
            if (owner := await link.server.owner(topic)) is not None:
                raise TopicRefused(ServerError.ServiceNotReady, f"{topic} is served by {owner}")
            version = await self.version_for(topic, cmd.schema)
        except TopicRefused as exc:
            link.send(
                GetOrCreateSchemaResponse(
                    request_id=rid, error_code=exc.error, error_message=exc.message
                )
            )
            return
        except BackendError as exc:
            log.info("%s: schema for %s refused: %s", link.ctx.peer, cmd.topic, exc)
            link.send(
                GetOrCreateSchemaResponse(
                    request_id=rid, error_code=server_error(exc), error_message=str(exc)
                )
            )
            return
        link.send(GetOrCreateSchemaResponse(request_id=rid, schema_version=version))


def _unreachable(keeper: str, owner: str) -> BackendError:
    # "closed" answers ServiceNotReady: the client tries again.
    return BackendError(
        f"the owner of {keeper}'s schema ({owner}) cannot be asked now", reason="closed"
    )


def _version(owner: str, data: bytes | None) -> int:
    try:
        return version_number(data or b"")
    except ValueError as exc:
        raise BackendError(f"{owner}: {exc}", reason="bad_answer") from None
