"""The compatibility rules: which schema may follow a topic's schemas under each rule."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import get_args

import pytest

from mop.schemas import Compatibility, SchemaInfo, SchemaKind
from mop.schemas.compatibility import (
    check_definition,
    incompatibility,
    reader_incompatibility,
)
from mop.settings import SchemaCompatibility

C = Compatibility


def record(*fields: Mapping[str, object], kind: SchemaKind = SchemaKind.AVRO) -> SchemaInfo:
    definition = {"type": "record", "name": "User", "fields": list(fields)}
    return SchemaInfo(kind, json.dumps(definition).encode())


NAME = {"name": "name", "type": "string"}
AGE = {"name": "age", "type": "int"}  # required: no default
OPTIONAL_AGE = {"name": "age", "type": ["null", "int"], "default": None}

V1 = record(NAME)
ADDS_REQUIRED = record(NAME, AGE)
ADDS_OPTIONAL = record(NAME, OPTIONAL_AGE)


def test_adding_a_required_field_is_forward_but_not_backward_compatible() -> None:
    # New readers would find no value for "age" in old data; old readers skip it in new data.
    assert incompatibility([V1], ADDS_REQUIRED, C.BACKWARD) is not None
    assert incompatibility([V1], ADDS_REQUIRED, C.FORWARD) is None
    assert incompatibility([V1], ADDS_REQUIRED, C.FULL) is not None


def test_removing_a_required_field_is_backward_but_not_forward_compatible() -> None:
    assert incompatibility([ADDS_REQUIRED], V1, C.BACKWARD) is None
    assert incompatibility([ADDS_REQUIRED], V1, C.FORWARD) is not None
    assert incompatibility([ADDS_REQUIRED], V1, C.FULL) is not None


def test_adding_a_field_with_a_default_is_fully_compatible() -> None:
    for rule in (C.BACKWARD, C.FORWARD, C.FULL, C.FULL_TRANSITIVE):
        assert incompatibility([V1], ADDS_OPTIONAL, rule) is None


def test_always_compatible_takes_anything_and_always_incompatible_nothing_new() -> None:
    assert incompatibility([V1], SchemaInfo(SchemaKind.STRING), C.ALWAYS_COMPATIBLE) is None
    reason = incompatibility([V1], ADDS_OPTIONAL, C.ALWAYS_INCOMPATIBLE)
    assert reason is not None and "ALWAYS_INCOMPATIBLE" in reason


def test_another_kind_is_refused_unless_always_compatible() -> None:
    reason = incompatibility([V1], SchemaInfo(SchemaKind.STRING), C.FULL)
    assert reason is not None and "AVRO" in reason and "STRING" in reason
    assert incompatibility([V1], record(NAME, kind=SchemaKind.JSON), C.BACKWARD) is not None


def test_a_json_schema_that_is_no_avro_record_is_followed_only_by_itself() -> None:
    # A JSON Schema document, as older Pulsar clients wrote them: valid, but not comparable.
    draft = SchemaInfo(SchemaKind.JSON, b'{"type": "object", "properties": {}}')
    assert check_definition(draft) is None
    assert incompatibility([draft], record(NAME, kind=SchemaKind.JSON), C.FULL) is not None
    assert incompatibility([record(NAME, kind=SchemaKind.JSON)], draft, C.FULL) is not None
    assert incompatibility([draft], record(NAME, kind=SchemaKind.JSON), C.ALWAYS_COMPATIBLE) is None


def test_primitive_schemas_of_one_kind_follow_each_other() -> None:
    old = SchemaInfo(SchemaKind.STRING, properties=(("a", "1"),))
    assert incompatibility([old], SchemaInfo(SchemaKind.STRING), C.FULL) is None


def test_json_definitions_are_compared_as_avro_records() -> None:
    v1 = record(NAME, kind=SchemaKind.JSON)
    assert incompatibility([v1], record(NAME, AGE, kind=SchemaKind.JSON), C.BACKWARD) is not None
    assert incompatibility([v1], record(NAME, OPTIONAL_AGE, kind=SchemaKind.JSON), C.FULL) is None


def test_the_transitive_rules_check_every_version_the_others_only_the_last() -> None:
    # v1 drops v0's string "score"; v2 brings it back as an int with a default: readers of v2
    # read v1's data (the default fills it in) but not v0's (a string where an int is due).
    v0 = record(NAME, {"name": "score", "type": "string"})
    v1 = record(NAME)
    v2 = record(NAME, {"name": "score", "type": "int", "default": 0})
    assert incompatibility([v0, v1], v2, C.BACKWARD) is None
    reason = incompatibility([v0, v1], v2, C.BACKWARD_TRANSITIVE)
    assert reason is not None and "version 0" in reason


def test_a_definition_that_is_not_avro_is_refused() -> None:
    assert check_definition(SchemaInfo(SchemaKind.AVRO, b"{not json")) is not None
    assert check_definition(SchemaInfo(SchemaKind.AVRO, b'{"type": "recordd"}')) is not None
    assert check_definition(SchemaInfo(SchemaKind.JSON, b"{not json")) is not None
    assert check_definition(V1) is None
    assert check_definition(SchemaInfo(SchemaKind.STRING, b"anything")) is None


@pytest.mark.parametrize("rule", list(Compatibility))
def test_a_promotable_field_type_change_is_refused_only_by_always_incompatible(
    rule: Compatibility,
) -> None:
    # A field changing from string to bytes: Avro promotes string <-> bytes both ways.
    old = record({"name": "blob", "type": "string"})
    new = record({"name": "blob", "type": "bytes"})
    expected_refused = rule is Compatibility.ALWAYS_INCOMPATIBLE
    assert (incompatibility([old], new, rule) is not None) == expected_refused


def test_the_setting_names_every_rule() -> None:
    assert set(get_args(SchemaCompatibility)) == {rule.value for rule in Compatibility}


def test_a_reader_is_taken_when_it_is_a_known_version_or_could_follow() -> None:
    # A known version is taken whatever the rule; a new one as a producer's would be.
    assert reader_incompatibility([V1, ADDS_OPTIONAL], V1, C.ALWAYS_INCOMPATIBLE) is None
    assert reader_incompatibility([V1], ADDS_OPTIONAL, C.FULL) is None
    assert reader_incompatibility([V1], ADDS_REQUIRED, C.FULL) is not None
    assert reader_incompatibility([V1], SchemaInfo(SchemaKind.AVRO, b"{"), C.ALWAYS_COMPATIBLE)
