"""`SchemaRegistry`: the schemas of every topic and the compatibility rule of each namespace,
kept in two durable tables of the broker that owns them.

A topic's versions are one table entry (JSON), rewritten when a version is added; a lock makes
each look-up-then-add one step, so two producers that bring the same new schema at once get one
version between them. There is one lock per schema name, and parsing and comparing
definitions (costly for large Avro schemas) runs in a worker thread, a few at a time, with
definitions larger than `max_bytes` refused before any of it: a client cannot hold up the
broker's event loop, nor the schemas of other topics.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import trio

from mop.clock import now_ms
from mop.processor.backend import BackendError, Table
from mop.schemas.compatibility import check_definition, incompatibility, known_version
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

# The largest schema definition accepted unless told otherwise (`pulsar.schema_max_bytes`).
DEFAULT_MAX_BYTES: Final = 64 * 1024

# How many definitions are parsed and compared at once, in worker threads.
_CHECKERS: Final = 2


def _judge(
    existing: Sequence[SchemaInfo], new: SchemaInfo, rule: Compatibility
) -> int | str | None:
    """Run in a worker thread: the version of `existing` that `new` is again (parsed the same),
    else why it may not be added after them, else None."""
    known = known_version(existing, new)
    if known is not None:
        return known
    reason = check_definition(new)
    if reason is None and existing:
        reason = incompatibility(existing, new, rule)
    return reason


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
    def __init__(
        self,
        schemas: Table,
        policies: Table,
        default: Compatibility,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._schemas = schemas
        self._policies = policies
        self.default = default
        self.max_bytes = max_bytes
        # Schema name -> its lock and how many tasks hold or wait for it (dropped at 0).
        self._locks: dict[str, tuple[trio.Lock, int]] = {}
        self._checkers = trio.CapacityLimiter(_CHECKERS)

    @asynccontextmanager
    async def _locked(self, name: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(name, (trio.Lock(), 0))
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    def _check_size(self, info: SchemaInfo) -> None:
        if len(info.data) > self.max_bytes:
            raise IncompatibleSchema(
                f"the schema definition is {len(info.data)} bytes, more than the "
                f"{self.max_bytes} this broker accepts (pulsar.schema_max_bytes)"
            )

    async def _judged(
        self, existing: Sequence[SchemaInfo], new: SchemaInfo, rule: Compatibility
    ) -> int | str | None:
        return await trio.to_thread.run_sync(
            _judge, existing, new, rule, limiter=self._checkers, abandon_on_cancel=True
        )

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
        self._check_size(info)
        name = schema_name(topic)
        async with self._locked(name):
            versions = self.versions(topic)
            for stored in versions:
                if stored.info.same_as(info):  # the cheap look first: the very same bytes
                    return stored.version
            rule = self.compatibility(namespace_of(topic))
            reason = await self._judged([s.info for s in versions], info, rule)
            if isinstance(reason, int):
                return reason
            if reason is not None:
                raise IncompatibleSchema(f"{name}: {reason}" if versions else reason)
            added = StoredSchema(len(versions), info, now_ms())
            await self._schemas.put(name, _encode([*versions, added]))
            return added.version

    async def delete(self, topic: str) -> int | None:
        """Forget every version of `topic`'s schema (when the topic is deleted, or through the
        admin API); the latest version it had, None when it had none."""
        name = schema_name(topic)
        async with self._locked(name):
            versions = self.versions(topic)
            if not versions:
                return None
            await self._schemas.put(name, None)
            return versions[-1].version
