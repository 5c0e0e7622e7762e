"""Whether a new schema may follow a topic's schemas under a namespace's compatibility rule.

Pure functions. AVRO and JSON definitions are Avro record schemas (Pulsar's JSON schemas are
written as Avro records); they are parsed and compared by the `avro` package's reader/writer
compatibility checker, the reference implementation of Avro's schema resolution rules. Other
kinds have no definition to compare: a schema of the same kind follows any other, unless the
rule is ALWAYS_INCOMPATIBLE.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

import avro.errors
import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from mop.schemas.model import Compatibility, SchemaInfo, SchemaKind

__all__ = ["check_definition", "incompatibility", "reader_incompatibility"]

# The kinds whose definition is an Avro schema.
_AVRO_KINDS: Final = frozenset({SchemaKind.AVRO, SchemaKind.JSON})

# (reader is new, writer is new) for each rule that compares definitions.
_DIRECTIONS: Final[dict[Compatibility, tuple[bool, ...]]] = {
    Compatibility.BACKWARD: (True,),
    Compatibility.BACKWARD_TRANSITIVE: (True,),
    Compatibility.FORWARD: (False,),
    Compatibility.FORWARD_TRANSITIVE: (False,),
    Compatibility.FULL: (True, False),
    Compatibility.FULL_TRANSITIVE: (True, False),
}


def _parse(info: SchemaInfo) -> avro.schema.Schema:
    try:
        return avro.schema.parse(info.data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError, avro.errors.AvroException) as exc:
        raise ValueError(f"not a valid Avro schema definition: {exc}") from None


def check_definition(info: SchemaInfo) -> str | None:
    """Why `info` is not a valid schema of its kind (None when it is). A JSON schema may also
    be a JSON Schema document, as older Pulsar clients write them: such a one is only ever
    followed by itself (no rule compares it), unless the rule is ALWAYS_COMPATIBLE."""
    if info.kind is SchemaKind.JSON:
        try:
            json.loads(info.data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"JSON schema: the definition is not JSON: {exc}"
        return None
    if info.kind is not SchemaKind.AVRO:
        return None
    try:
        _parse(info)
    except ValueError as exc:
        return f"AVRO schema: {exc}"
    return None


def _avro_reason(new: SchemaInfo, old: SchemaInfo, version: int, new_reads: bool) -> str | None:
    try:
        new_schema, old_schema = _parse(new), _parse(old)
    except ValueError as exc:
        return str(exc)
    reader, writer = (new_schema, old_schema) if new_reads else (old_schema, new_schema)
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]  # avro ships no hints here
    result = checker.get_compatibility(reader, writer)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return None
    who = (
        f"readers of the new schema cannot read data written with version {version}"
        if new_reads
        else f"readers of version {version} cannot read data written with the new schema"
    )
    details = "; ".join(sorted(str(m) for m in result.messages))
    return f"{who}" + (f" ({details})" if details else "")


def incompatibility(
    existing: Sequence[SchemaInfo], new: SchemaInfo, rule: Compatibility
) -> str | None:
    """Why `new` may not follow `existing` (oldest first, not empty) under `rule`; None when it
    may. A schema equal to one of `existing` is no new version and is not asked about."""
    if rule is Compatibility.ALWAYS_COMPATIBLE:
        return None
    if rule is Compatibility.ALWAYS_INCOMPATIBLE:
        return "the namespace's schema compatibility is ALWAYS_INCOMPATIBLE"
    latest = len(existing) - 1
    if existing[latest].kind is not new.kind:
        return (
            f"the topic's schema is {existing[latest].kind.value}, "
            f"not {new.kind.value} (compatibility {rule.value})"
        )
    if new.kind not in _AVRO_KINDS:
        return None
    versions = range(latest + 1) if rule.transitive else (latest,)
    for version in reversed(versions):
        old = existing[version]
        if old.kind is not new.kind:
            return f"version {version} is {old.kind.value}, not {new.kind.value}"
        for new_reads in _DIRECTIONS[rule]:
            reason = _avro_reason(new, old, version, new_reads)
            if reason is not None:
                return f"{reason} (compatibility {rule.value})"
    return None


def reader_incompatibility(
    existing: Sequence[SchemaInfo], new: SchemaInfo, rule: Compatibility
) -> str | None:
    """Why a consumer with schema `new` may not read a topic with schemas `existing` (oldest
    first, not empty) under `rule`; None when it may: it is one of them, or it is valid and
    could follow them."""
    if any(known.same_as(new) for known in existing):
        return None
    return check_definition(new) or incompatibility(existing, new, rule)
