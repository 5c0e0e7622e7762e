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


@pytest.mark.parametrize("kind", [SchemaKind.AVRO, SchemaKind.JSON])
def test_a_deeply_nested_definition_is_refused_not_raised(kind: SchemaKind) -> None:
    nested = SchemaInfo(kind, b"[" * 100_000)
    reason = check_definition(nested)
    assert reason is not None and "nested too deeply" in reason
    assert incompatibility([record(NAME, kind=kind)], nested, C.FULL) is not None
    assert reader_incompatibility([record(NAME, kind=kind)], nested, C.ALWAYS_COMPATIBLE)


@pytest.mark.parametrize("definition", [b"null", b"[]", b"42", b'"text"'])
def test_a_json_definition_must_be_an_avro_schema_or_a_json_schema_object(
    definition: bytes,
) -> None:
    assert check_definition(SchemaInfo(SchemaKind.JSON, definition)) is not None


def test_a_reader_must_read_the_latest_version_under_the_non_transitive_rules() -> None:
    # Pulsar checks a consumer BACKWARD against the latest version under BACKWARD, FORWARD,
    # FORWARD_TRANSITIVE and FULL, whatever the rule says of producers.
    for rule in (C.BACKWARD, C.FORWARD, C.FORWARD_TRANSITIVE, C.FULL):
        # A reader that needs a field the data lacks: refused even under FORWARD.
        assert reader_incompatibility([V1], ADDS_REQUIRED, rule) is not None, rule
        # A reader that drops a required field reads the data: taken even under FULL.
        assert reader_incompatibility([ADDS_REQUIRED], V1, rule) is None, rule


def test_a_reader_must_follow_every_version_under_the_transitive_backward_and_full_rules() -> None:
    v0 = record(NAME, {"name": "score", "type": "string"})
    v1 = record(NAME)
    v2 = record(NAME, {"name": "score", "type": "int", "default": 0})
    assert reader_incompatibility([v0, v1], v2, C.BACKWARD) is None
    assert reader_incompatibility([v0, v1], v2, C.FULL) is None
    for rule in (C.BACKWARD_TRANSITIVE, C.FULL_TRANSITIVE):
        reason = reader_incompatibility([v0, v1], v2, rule)
        assert reason is not None and "version 0" in reason
    assert reader_incompatibility([ADDS_REQUIRED], V1, C.FULL_TRANSITIVE) is not None


def test_a_reader_written_differently_is_a_known_version() -> None:
    spaced = SchemaInfo(SchemaKind.AVRO, json.dumps(json.loads(V1.data), indent=2).encode())
    assert reader_incompatibility([V1, ADDS_OPTIONAL], spaced, C.ALWAYS_INCOMPATIBLE) is None
