"""Schemas through the backend contract: kept by the broker that owns the topic (the local
broker, or the mop broker a separated proxy asks with GET_SCHEMA / GET_OR_CREATE_SCHEMA)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
import trio

from mop.processor.backend import Backend
from mop.schemas import IncompatibleSchema, SchemaInfo, SchemaKind
from tests.conformance.harness import Names


def avro(*fields: Mapping[str, object]) -> SchemaInfo:
    definition = {"type": "record", "name": "Reading", "fields": list(fields)}
    return SchemaInfo(SchemaKind.AVRO, json.dumps(definition).encode(), (("origin", "test"),))


V0 = avro({"name": "value", "type": "double"})
# A field with a default: fully compatible, so the default rule (FULL) takes it.
V1 = avro({"name": "value", "type": "double"}, {"name": "unit", "type": "string", "default": ""})
# Another field with a default: compatible with both V0 and V1.
V1_OTHER = avro(
    {"name": "value", "type": "double"}, {"name": "site", "type": "string", "default": ""}
)
# A required field: readers of it cannot read v0's data.
REFUSED = avro({"name": "value", "type": "double"}, {"name": "sensor", "type": "string"})


async def test_versions_count_from_zero_and_a_known_schema_gets_its_version(
    backend: Backend, names: Names
) -> None:
    topic = names.topic("readings")
    assert await backend.schema(topic) is None
    assert await backend.get_or_create_schema(topic, V0) == 0
    assert await backend.get_or_create_schema(topic, V0) == 0
    assert await backend.get_or_create_schema(topic, V1) == 1
    assert await backend.get_or_create_schema(topic, V0) == 0  # an older one is found again
    latest = await backend.schema(topic)
    assert latest is not None and latest.version == 1
    assert (latest.info.kind, latest.info.data) == (SchemaKind.AVRO, V1.data)
    assert latest.info.properties == (("origin", "test"),)
    first = await backend.schema(topic, 0)
    assert first is not None and first.info.data == V0.data
    assert await backend.schema(topic, 7) is None


async def test_an_incompatible_schema_is_refused_and_not_added(
    backend: Backend, names: Names
) -> None:
    topic = names.topic("strict")
    await backend.get_or_create_schema(topic, V0)
    with pytest.raises(IncompatibleSchema):
        await backend.get_or_create_schema(topic, REFUSED)
    with pytest.raises(IncompatibleSchema):
        await backend.get_or_create_schema(topic, SchemaInfo(SchemaKind.STRING))
    latest = await backend.schema(topic)
    assert latest is not None and latest.version == 0


async def test_the_partitions_of_a_topic_share_its_schemas(backend: Backend, names: Names) -> None:
    topic = names.topic("parted")
    assert await backend.get_or_create_schema(topic + "-partition-0", V0) == 0
    stored = await backend.schema(topic)
    assert stored is not None and stored.info.data == V0.data


async def test_schemas_brought_at_once_each_get_one_version_and_none_is_lost(
    backend: Backend, names: Names
) -> None:
    # Two different new schemas, each brought twice, at once: each look-up-then-add must be
    # one step, or two of them both take version 1 and one is lost.
    topic = names.topic("race")
    assert await backend.get_or_create_schema(topic, V0) == 0
    versions: dict[bytes, set[int]] = {V1.data: set(), V1_OTHER.data: set()}

    async def bring(schema: SchemaInfo) -> None:
        versions[schema.data].add(await backend.get_or_create_schema(topic, schema))

    async with trio.open_nursery() as nursery:
        for schema in (V1, V1_OTHER, V1, V1_OTHER):
            nursery.start_soon(bring, schema)
    [v1], [other] = versions[V1.data], versions[V1_OTHER.data]
    assert {v1, other} == {1, 2}
    for schema, version in ((V1, v1), (V1_OTHER, other)):
        stored = await backend.schema(topic, version)
        assert stored is not None and stored.info.data == schema.data
    latest = await backend.schema(topic)
    assert latest is not None and latest.version == 2
