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

__all__ = ["check_definition", "incompatibility", "known_version", "reader_incompatibility"]

# The kinds whose definition is an Avro schema.
_AVRO_KINDS: Final = frozenset({SchemaKind.AVRO, SchemaKind.JSON})
# The kinds Pulsar tells apart by their parsed Avro definitions (a PROTOBUF schema's definition
# is the Avro schema Pulsar's clients derive from the message type); others by their bytes.
_PARSED_KINDS: Final = frozenset({SchemaKind.AVRO, SchemaKind.JSON, SchemaKind.PROTOBUF})

# (reader is new, writer is new) for each rule that compares definitions.
_DIRECTIONS: Final[dict[Compatibility, tuple[bool, ...]]] = {
    Compatibility.BACKWARD: (True,),
    Compatibility.BACKWARD_TRANSITIVE: (True,),
    Compatibility.FORWARD: (False,),
    Compatibility.FORWARD_TRANSITIVE: (False,),
    Compatibility.FULL: (True, False),
    Compatibility.FULL_TRANSITIVE: (True, False),
}


# What parsing a definition a client wrote can raise: besides the errors meant for it, the
# `avro` package lets malformed input through as the built-in errors below, and a deeply
# nested one (`[[[[...`) exhausts the recursion limit of `json` or of the parser.
_PARSE_ERRORS: Final = (
    UnicodeDecodeError,
    ValueError,  # json.JSONDecodeError among them
    TypeError,
    KeyError,
    AttributeError,
    IndexError,
    RecursionError,
    avro.errors.AvroException,
)


def _parse(info: SchemaInfo) -> avro.schema.Schema:
    try:
        return avro.schema.parse(info.data.decode())
    except _PARSE_ERRORS as exc:
        raise ValueError(f"not a valid Avro schema definition: {_short(exc)}") from None


def _short(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    return str(exc)[:200]


def check_definition(info: SchemaInfo) -> str | None:
    """Why `info` is not a valid schema of its kind (None when it is). A JSON schema is an
    Avro record schema, or a JSON Schema document (a JSON object) as older Pulsar clients
    write them: such a one is only ever followed by itself (no rule compares it), unless the
    rule is ALWAYS_COMPATIBLE."""
    if info.kind is SchemaKind.JSON:
        try:
            document = json.loads(info.data)
        except _PARSE_ERRORS as exc:
            return f"JSON schema: the definition is not JSON: {_short(exc)}"
        if not isinstance(document, dict):
            return "JSON schema: the definition is neither an Avro record nor a JSON Schema object"
        return None
    if info.kind is not SchemaKind.AVRO:
        return None
    try:
        _parse(info)
    except ValueError as exc:
        return f"AVRO schema: {exc}"
    return None


def known_version(existing: Sequence[SchemaInfo], new: SchemaInfo) -> int | None:
    """The index of the schema of `existing` that `new` is again, as Pulsar tells them apart:
    the same kind and, for AVRO, JSON and PROTOBUF, equal parsed definitions (so whitespace and
    key order aside), else the same bytes; properties aside. None when it is none of them."""
    for version, old in enumerate(existing):
        if old.same_as(new):
            return version
    if new.kind not in _PARSED_KINDS:
        return None
    try:
        parsed = _parse(new)
    except ValueError:
        return None
    for version, old in enumerate(existing):
        if old.kind is not new.kind:
            continue
        try:
            if _parse(old) == parsed:
                return version
        except ValueError:
            continue
    return None


def _avro_reason(
    new_schema: avro.schema.Schema, old: SchemaInfo, version: int, new_reads: bool
) -> str | None:
    try:
        old_schema = _parse(old)
    except ValueError as exc:
        return str(exc)
    reader, writer = (new_schema, old_schema) if new_reads else (old_schema, new_schema)
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]  # avro ships no hints here
    try:
        result = checker.get_compatibility(reader, writer)
    except RecursionError:
        return f"version {version} and the new schema are nested too deeply to compare"
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
    try:
        # Parsed once, compared with each version.
        new_schema = _parse(new)
    except ValueError as exc:
        return str(exc)
    versions = range(latest + 1) if rule.transitive else (latest,)
    for version in reversed(versions):
        old = existing[version]
        if old.kind is not new.kind:
            return f"version {version} is {old.kind.value}, not {new.kind.value}"
        for new_reads in _DIRECTIONS[rule]:
            reason = _avro_reason(new_schema, old, version, new_reads)
            if reason is not None:
                return f"{reason} (compatibility {rule.value})"
    return None


# The rules under which a consumer's schema is checked against every version (as the rule
# itself says); under the others it need only read data written with the latest one.
_READER_CHECKS_ALL: Final = frozenset(
    {
        Compatibility.BACKWARD_TRANSITIVE,
        Compatibility.FULL_TRANSITIVE,
        Compatibility.ALWAYS_INCOMPATIBLE,
    }
)


def reader_incompatibility(
    existing: Sequence[SchemaInfo], new: SchemaInfo, rule: Compatibility
) -> str | None:
    """Why a consumer with schema `new` may not read a topic with schemas `existing` (oldest
    first, not empty) under `rule`; None when it may. As Pulsar's brokers check consumers: it
    must read data written with the latest version (BACKWARD) under BACKWARD, FORWARD,
    FORWARD_TRANSITIVE and FULL; follow every version under the rule itself under
    BACKWARD_TRANSITIVE and FULL_TRANSITIVE; anything goes under ALWAYS_COMPATIBLE. One of the
    topic's versions is always taken."""
    if known_version(existing, new) is not None:
        return None
    reason = check_definition(new)
    if reason is not None or rule is Compatibility.ALWAYS_COMPATIBLE:
        return reason
    if rule in _READER_CHECKS_ALL:
        return incompatibility(existing, new, rule)
    reason = incompatibility(existing[-1:], new, Compatibility.BACKWARD)
    return None if reason is None else f"a consumer's schema must read the latest one: {reason}"
