"""`SchemaRegistry` over tables: versions, namespace rules, and entries it cannot read (the
tables are topics that a Pulsar client with the rights can write)."""

from __future__ import annotations

import json

import pytest

from mop.messaging import BackendError
from mop.schemas import Compatibility, IncompatibleSchema, SchemaInfo, SchemaKind
from mop.schemas.registry import SchemaRegistry
from tests.unit.protocols.mqtt.serving.shared_table import SharedTable

TOPIC = "persistent://public/default/readings"


def registry(default: Compatibility = Compatibility.FULL) -> SchemaRegistry:
    return SchemaRegistry(SharedTable("s", {}, []), SharedTable("p", {}, []), default)


def avro(*names: str) -> SchemaInfo:
    fields = [{"name": n, "type": "string"} for n in names]
    definition = {"type": "record", "name": "R", "fields": fields}
    return SchemaInfo(SchemaKind.AVRO, json.dumps(definition).encode())


async def test_versions_are_kept_under_the_topics_schema_name() -> None:
    schemas = registry()
    assert await schemas.get_or_create(TOPIC + "-partition-1", avro("a")) == 0
    [stored] = schemas.versions("non-persistent://public/default/readings")
    assert stored.info.name == "public/default/readings" and stored.timestamp > 0


async def test_the_namespace_rule_overrides_the_default_and_can_be_dropped() -> None:
    schemas = registry(Compatibility.ALWAYS_INCOMPATIBLE)
    await schemas.get_or_create(TOPIC, avro("a"))
    with pytest.raises(IncompatibleSchema, match="ALWAYS_INCOMPATIBLE"):
        await schemas.get_or_create(TOPIC, avro("a", "b"))
    await schemas.set_compatibility("public/default", Compatibility.FORWARD)
    assert schemas.compatibility("public/default") is Compatibility.FORWARD
    assert schemas.compatibility("public/other") is Compatibility.ALWAYS_INCOMPATIBLE
    assert await schemas.get_or_create(TOPIC, avro("a", "b")) == 1
    await schemas.set_compatibility("public/default", None)
    assert schemas.compatibility("public/default") is Compatibility.ALWAYS_INCOMPATIBLE


async def test_an_invalid_definition_is_refused_even_as_the_first_version() -> None:
    schemas = registry()
    with pytest.raises(IncompatibleSchema, match="not a valid Avro schema"):
        await schemas.get_or_create(TOPIC, SchemaInfo(SchemaKind.AVRO, b"{}"))
    assert schemas.get(TOPIC) is None


async def test_entries_it_cannot_read_are_a_storage_error_not_a_crash() -> None:
    schemas_table = SharedTable("s", {"public/default/readings": b"not json"}, [])
    policies = SharedTable("p", {"public/default": b"SOMETIMES"}, [])
    schemas = SchemaRegistry(schemas_table, policies, Compatibility.FULL)
    with pytest.raises(BackendError) as unreadable:
        schemas.get(TOPIC)
    assert unreadable.value.reason == "storage_error"
    with pytest.raises(BackendError) as odd_rule:
        schemas.compatibility("public/default")
    assert odd_rule.value.reason == "storage_error"
