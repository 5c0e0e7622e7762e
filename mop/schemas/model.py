"""The words of schemas, shared by the processor, the backends and the adapters: what a schema
is, the versions a topic keeps of it, and the namespace rules that decide which may follow.

They follow Pulsar's schema registry: a topic's schemas are kept under its name without a
partition suffix, numbered from 0 in the order they were added.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mop.messaging import BackendError

__all__ = [
    "Compatibility",
    "IncompatibleSchema",
    "SchemaInfo",
    "SchemaKind",
    "StoredSchema",
]


class SchemaKind(StrEnum):
    """The kind of a schema, named as Pulsar's admin API names it."""

    NONE = "NONE"  # raw bytes: no schema
    STRING = "STRING"
    JSON = "JSON"
    PROTOBUF = "PROTOBUF"
    AVRO = "AVRO"
    BOOLEAN = "BOOLEAN"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FLOAT = "FLOAT"
    DOUBLE = "DOUBLE"
    DATE = "DATE"
    TIME = "TIME"
    TIMESTAMP = "TIMESTAMP"
    KEY_VALUE = "KEY_VALUE"
    INSTANT = "INSTANT"
    LOCAL_DATE = "LOCAL_DATE"
    LOCAL_TIME = "LOCAL_TIME"
    LOCAL_DATE_TIME = "LOCAL_DATE_TIME"
    PROTOBUF_NATIVE = "PROTOBUF_NATIVE"
    # A consumer that takes whatever schema the topic has: it registers nothing.
    AUTO_CONSUME = "AUTO_CONSUME"
    EXTERNAL = "EXTERNAL"

    @property
    def registered(self) -> bool:
        """Whether a producer or consumer of this kind has a schema to register and check."""
        return self not in (SchemaKind.NONE, SchemaKind.AUTO_CONSUME)


class Compatibility(StrEnum):
    """Which new schema a namespace accepts after the ones a topic has (Pulsar's
    SchemaCompatibilityStrategy). BACKWARD: readers of the new schema read data written with
    the last one; FORWARD: readers of the last one read data written with the new one; FULL:
    both. The _TRANSITIVE ones check against every version, not only the last."""

    ALWAYS_INCOMPATIBLE = "ALWAYS_INCOMPATIBLE"
    ALWAYS_COMPATIBLE = "ALWAYS_COMPATIBLE"
    BACKWARD = "BACKWARD"
    FORWARD = "FORWARD"
    FULL = "FULL"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @property
    def transitive(self) -> bool:
        return self.name.endswith("_TRANSITIVE")


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """A schema as a client gives it: its kind, its definition (an Avro record schema in JSON
    for AVRO and JSON, empty for most primitive kinds) and free-form properties."""

    kind: SchemaKind
    data: bytes = b""
    properties: tuple[tuple[str, str], ...] = ()
    name: str = ""

    def same_as(self, other: SchemaInfo) -> bool:
        """Whether `other` has this schema's kind and definition, byte for byte (name and
        properties aside, as Pulsar tells schemas apart). `compatibility.known_version` also
        takes a definition written differently that parses to the same Avro schema."""
        return self.kind is other.kind and self.data == other.data


@dataclass(frozen=True, slots=True)
class StoredSchema:
    """One version of a topic's schema."""

    version: int
    info: SchemaInfo
    # When it was added, in ms since the epoch.
    timestamp: int = 0


class IncompatibleSchema(BackendError):
    """The schema does not follow the topic's schemas under its namespace's compatibility
    rule, or it is not a valid schema of its kind."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="incompatible_schema")
