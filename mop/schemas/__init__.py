"""Schemas of topics: the shared words (`model`), the compatibility rules (`compatibility`) and
the registry a broker keeps (`registry`)."""

from mop.schemas.model import (
    Compatibility,
    IncompatibleSchema,
    SchemaInfo,
    SchemaKind,
    StoredSchema,
)
from mop.schemas.names import namespace_of, schema_name

__all__ = [
    "Compatibility",
    "IncompatibleSchema",
    "SchemaInfo",
    "SchemaKind",
    "StoredSchema",
    "namespace_of",
    "schema_name",
]
