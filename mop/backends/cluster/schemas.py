"""Schemas in separated mode: asked of the broker that owns the topic (GET_SCHEMA,
GET_OR_CREATE_SCHEMA), which keeps them and applies its namespace's compatibility rule, be it
a mop broker node or Apache Pulsar."""

from __future__ import annotations

from mop.backends.cluster.errors import error_for
from mop.processor.backend import BackendError
from mop.protocols.pulsar.commands import (
    GetOrCreateSchema,
    GetOrCreateSchemaResponse,
    GetSchema,
    GetSchemaResponse,
    Schema,
)
from mop.protocols.pulsar.driver import DriverError, PulsarClient, ServerRefused, Unavailable
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.schemas import (
    schema_info,
    schema_message,
    version_bytes,
    version_number,
)
from mop.schemas.model import IncompatibleSchema, SchemaInfo, StoredSchema

__all__ = ["BrokerSchemas"]


class BrokerSchemas:
    """The schema questions of one backend, through its client."""

    def __init__(self, client: PulsarClient, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    async def get(self, topic: str, version: int | None) -> StoredSchema | None:
        async def attempt() -> GetSchemaResponse:
            connection = await self._client.lookup(topic)
            answer = await connection.request(
                GetSchema(
                    request_id=connection.next_id(),
                    topic=topic,
                    schema_version=None if version is None else version_bytes(version),
                ),
                self._timeout,
            )
            if not isinstance(answer, GetSchemaResponse):
                raise Unavailable(f"unexpected answer {answer!r:.200}")
            if answer.error_code is not None and answer.error_code is not ServerError.TopicNotFound:
                raise ServerRefused(answer.error_code, answer.error_message or "")
            return answer

        what = f"schema of {topic}"
        try:
            answer = await self._client.retrying("GET_SCHEMA", attempt)
        except DriverError as exc:
            raise error_for(exc, what) from None
        if answer.error_code is not None or answer.schema is None:
            return None  # TopicNotFound: the topic has no (such version of a) schema
        try:
            number = version_number(answer.schema_version or b"")
        except ValueError as exc:
            raise BackendError(f"{what}: {exc}", reason="bad_answer") from None
        return _stored(number, answer.schema)

    async def get_or_create(self, topic: str, info: SchemaInfo) -> int:
        schema = schema_message(StoredSchema(0, info))

        async def attempt() -> GetOrCreateSchemaResponse:
            connection = await self._client.lookup(topic)
            answer = await connection.request(
                GetOrCreateSchema(request_id=connection.next_id(), topic=topic, schema=schema),
                self._timeout,
            )
            if not isinstance(answer, GetOrCreateSchemaResponse):
                raise Unavailable(f"unexpected answer {answer!r:.200}")
            if answer.error_code is not None and answer.error_code is not (
                ServerError.IncompatibleSchema
            ):
                raise ServerRefused(answer.error_code, answer.error_message or "")
            return answer

        what = f"schema of {topic}"
        try:
            answer = await self._client.retrying("GET_OR_CREATE_SCHEMA", attempt)
        except DriverError as exc:
            raise error_for(exc, what) from None
        if answer.error_code is not None:
            raise IncompatibleSchema(answer.error_message or f"{what}: incompatible")
        try:
            return version_number(answer.schema_version or b"")
        except ValueError as exc:
            raise BackendError(f"{what}: {exc}", reason="bad_answer") from None


def _stored(version: int, schema: Schema) -> StoredSchema:
    return StoredSchema(version, schema_info(schema))
