"""Pulsar's `Schema` message and schema version bytes <-> the protocol-neutral schema words.

A schema version travels as 8 bytes, big-endian (Pulsar brokers' long versions), in
PRODUCER_SUCCESS, in message metadata (as the producer sent it) and in the schema commands.
"""

from __future__ import annotations

import struct
from typing import Final

from mop.protocols.pulsar.commands import Schema, SchemaType
from mop.protocols.pulsar.metadata import KeyValue
from mop.schemas.model import SchemaInfo, SchemaKind, StoredSchema

__all__ = ["schema_info", "schema_message", "version_bytes", "version_number"]

_VERSION: Final = struct.Struct(">q")

# Both enums name the same kinds; Pulsar's "NONE" is the BYTES schema of the clients.
_KINDS: Final[dict[SchemaType, SchemaKind]] = {
    SchemaType.BOOL: SchemaKind.BOOLEAN,
    **{t: SchemaKind[t.name] for t in SchemaType if t is not SchemaType.BOOL},
}
_TYPES: Final[dict[SchemaKind, SchemaType]] = {kind: t for t, kind in _KINDS.items()}


def schema_info(schema: Schema) -> SchemaInfo:
    return SchemaInfo(
        kind=_KINDS[schema.type],
        data=schema.schema_data,
        properties=tuple((kv.key, kv.value) for kv in schema.properties),
        name=schema.name,
    )


def schema_message(stored: StoredSchema) -> Schema:
    info = stored.info
    return Schema(
        name=info.name,
        schema_data=info.data,
        type=_TYPES[info.kind],
        properties=tuple(KeyValue(key=k, value=v) for k, v in info.properties),
    )


def version_bytes(version: int) -> bytes:
    return _VERSION.pack(version)


def version_number(data: bytes) -> int:
    """The version that `data` encodes; ValueError when it is not 8 bytes."""
    if len(data) != _VERSION.size:
        raise ValueError(f"a schema version is {_VERSION.size} bytes, not {len(data)}")
    (version,) = _VERSION.unpack(data)
    return int(version)
