"""`SchemaRegistry`: the schemas of every topic and the compatibility rule of each namespace,
kept in two durable tables of the broker that owns them.

A topic's versions are one table entry (JSON), rewritten when a version is added; a lock makes
each look-up-then-add one step, so two producers that bring the same new schema at once get one
version between them.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import trio

from mop.clock import now_ms
from mop.processor.backend import BackendError, Table
from mop.schemas.compatibility import check_definition, incompatibility
from mop.schemas.model import (
    Compatibility,
    IncompatibleSchema,
    SchemaInfo,
    SchemaKind,
    StoredSchema,
)
from mop.schemas.names import namespace_of, schema_name

__all__ = ["SCHEMAS_TABLE", "SCHEMA_POLICIES_TABLE", "SchemaRegistry"]

# The tables' names (see `Backend.table`).
SCHEMAS_TABLE = "schemas"
SCHEMA_POLICIES_TABLE = "schema-compatibility"


def _encode(versions: list[StoredSchema]) -> bytes:
    rows = [
        {
            "kind": stored.info.kind.value,
            "data": base64.b64encode(stored.info.data).decode(),
            "properties": [list(pair) for pair in stored.info.properties],
            "timestamp": stored.timestamp,
        }
        for stored in versions
    ]
    return json.dumps(rows, separators=(",", ":")).encode()


def _decode(name: str, value: bytes) -> list[StoredSchema]:
    rows: list[dict[str, Any]] = json.loads(value)
    return [
        StoredSchema(
            version=version,
            info=SchemaInfo(
                kind=SchemaKind(row["kind"]),
                data=base64.b64decode(row["data"]),
                properties=tuple((str(k), str(v)) for k, v in row["properties"]),
                name=name,
            ),
            timestamp=int(row["timestamp"]),
        )
        for version, row in enumerate(rows)
    ]


class SchemaRegistry:
    def __init__(self, schemas: Table, policies: Table, default: Compatibility) -> None:
        self._schemas = schemas
        self._policies = policies
        self.default = default
        self._lock = trio.Lock()

    def versions(self, topic: str) -> list[StoredSchema]:
        """Every version of `topic`'s schema, oldest (version 0) first."""
        name = schema_name(topic)
        value = self._schemas.get(name)
        if value is None:
            return []
        try:
            return _decode(name, value)
        except (ValueError, KeyError, TypeError) as exc:
            # The table is a topic: a Pulsar client with the rights could write anything.
            raise BackendError(
                f"the schemas of {name} cannot be read: {exc!r}", reason="storage_error"
            ) from None

    def get(self, topic: str, version: int | None = None) -> StoredSchema | None:
        """Version `version` of `topic`'s schema (None: the latest); None when there is none."""
        versions = self.versions(topic)
        if not versions:
            return None
        if version is None:
            return versions[-1]
        return versions[version] if 0 <= version < len(versions) else None

    def compatibility(self, namespace: str) -> Compatibility:
        """The rule of `namespace` ("tenant/namespace"): its own, else the default."""
        value = self._policies.get(namespace)
        if value is None:
            return self.default
        try:
            return Compatibility(value.decode())
        except (ValueError, UnicodeDecodeError):
            raise BackendError(
                f"the schema compatibility of {namespace} cannot be read: {value[:40]!r}",
                reason="storage_error",
            ) from None

    async def set_compatibility(self, namespace: str, rule: Compatibility | None) -> None:
        """Set `namespace`'s rule (None: back to the default)."""
        await self._policies.put(namespace, None if rule is None else rule.value.encode())

    async def get_or_create(self, topic: str, info: SchemaInfo) -> int:
        """The version of `info` among `topic`'s schemas, added as the next version when it is
        new and its namespace's rule lets it follow them. Raises IncompatibleSchema."""
        reason = check_definition(info)
        if reason is not None:
            raise IncompatibleSchema(reason)
        async with self._lock:
            versions = self.versions(topic)
            for stored in versions:
                if stored.info.same_as(info):
                    return stored.version
            if versions:
                rule = self.compatibility(namespace_of(topic))
                reason = incompatibility([s.info for s in versions], info, rule)
                if reason is not None:
                    raise IncompatibleSchema(f"{schema_name(topic)}: {reason}")
            added = StoredSchema(len(versions), info, now_ms())
            await self._schemas.put(schema_name(topic), _encode([*versions, added]))
            return added.version
