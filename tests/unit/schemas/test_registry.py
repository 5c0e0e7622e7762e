"""`SchemaRegistry` over tables: versions, namespace rules, and entries it cannot read (the
tables are topics that a Pulsar client with the rights can write)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import trio

from mop.messaging import BackendError
from mop.schemas import Compatibility, IncompatibleSchema, SchemaInfo, SchemaKind
from mop.schemas import registry as registry_module
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


async def test_a_definition_over_the_size_limit_is_refused_before_it_is_parsed() -> None:
    schemas = SchemaRegistry(
        SharedTable("s", {}, []), SharedTable("p", {}, []), Compatibility.FULL, max_bytes=64
    )
    with pytest.raises(IncompatibleSchema, match="schema_max_bytes"):
        await schemas.get_or_create(TOPIC, avro("a_rather_long_field_name", "and_another_one"))
    assert schemas.versions(TOPIC) == []


async def test_a_slow_check_holds_up_neither_the_event_loop_nor_other_topics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A check that blocks until told: run on the event loop, or under a lock every topic
    # shares, it would keep the other topic's schema (and the timer) from going ahead.
    release = threading.Event()
    real_judge = registry_module._judge

    def judge(existing: Any, new: SchemaInfo, rule: Compatibility) -> str | None:
        if b"slow" in new.data:
            release.wait(10)
        return real_judge(existing, new, rule)

    monkeypatch.setattr(registry_module, "_judge", judge)
    schemas = registry()
    versions: dict[str, int] = {}

    async def add(topic: str, info: SchemaInfo) -> None:
        versions[topic] = await schemas.get_or_create(topic, info)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(add, TOPIC, avro("slow"))
        await trio.sleep(0.05)
        with trio.fail_after(2):
            await add(TOPIC + "-other", avro("quick"))
        assert TOPIC not in versions
        release.set()
    assert versions == {TOPIC: 0, TOPIC + "-other": 0}


async def test_deleting_forgets_every_version_and_says_the_latest() -> None:
    schemas = registry(Compatibility.ALWAYS_COMPATIBLE)
    assert await schemas.delete(TOPIC) is None
    await schemas.get_or_create(TOPIC, avro("a"))
    await schemas.get_or_create(TOPIC + "-partition-2", avro("a", "b"))
    assert await schemas.delete(TOPIC + "-partition-0") == 1
    assert schemas.versions(TOPIC) == []
    assert await schemas.get_or_create(TOPIC, SchemaInfo(SchemaKind.STRING)) == 0


async def test_a_schema_written_differently_or_with_other_properties_is_no_new_version() -> None:
    # As Pulsar tells schemas apart: parsed Avro definitions, kind and bytes for the others,
    # properties aside. Under ALWAYS_INCOMPATIBLE a new version would be refused.
    schemas = registry(Compatibility.ALWAYS_INCOMPATIBLE)
    first = avro("a")
    assert await schemas.get_or_create(TOPIC, first) == 0
    spaced = json.dumps(json.loads(first.data), indent=4, sort_keys=True).encode()
    assert spaced != first.data
    again = SchemaInfo(SchemaKind.AVRO, spaced, properties=(("origin", "other-client"),))
    assert await schemas.get_or_create(TOPIC, again) == 0
    other = "persistent://public/default/strings"
    assert await schemas.get_or_create(other, SchemaInfo(SchemaKind.STRING)) == 0
    tagged = SchemaInfo(SchemaKind.STRING, properties=(("k", "v"),))
    assert await schemas.get_or_create(other, tagged) == 0
    assert len(schemas.versions(TOPIC)) == 1 and len(schemas.versions(other)) == 1
