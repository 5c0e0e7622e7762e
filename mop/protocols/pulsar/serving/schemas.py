"""The schema commands of one Pulsar connection (GET_SCHEMA, GET_OR_CREATE_SCHEMA), and the
schema a producer or consumer brings, registered or found through the processor."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

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
from mop.protocols.pulsar.serving.server import TopicRefused, server_error
from mop.schemas import IncompatibleSchema, namespace_of, schema_name
from mop.schemas.compatibility import reader_incompatibility

if TYPE_CHECKING:
    from mop.protocols.pulsar.serving.handler import PulsarConnection

__all__ = ["ConnectionSchemas"]

log = logging.getLogger("mop.pulsar")


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
        version = await self._link.server.processor.get_or_create_schema(topic, info)
        return version_bytes(version)

    async def check_consumer(self, topic: str, schema: Schema | None) -> None:
        """Check the schema a consumer of `topic` brings, as Pulsar brokers do: on a topic
        without a schema it becomes the first version; otherwise it must be one of the topic's
        versions or follow them under the namespace's rule, and is not added. Raises
        BackendError (IncompatibleSchema) when it may not."""
        if schema is None:
            return
        info = schema_info(schema)
        if not info.kind.registered:
            return
        processor = self._link.server.processor
        latest = await processor.schema(topic)
        if latest is None:
            await processor.get_or_create_schema(topic, info)
            return
        versions = [latest.info]
        for version in range(latest.version - 1, -1, -1):
            stored = await processor.schema(topic, version)
            if stored is not None:
                versions.insert(0, stored.info)
        rule = await processor.schema_compatibility(namespace_of(topic))
        reason = reader_incompatibility(versions, info, rule)
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
            stored = await link.server.processor.schema(topic, version)
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
