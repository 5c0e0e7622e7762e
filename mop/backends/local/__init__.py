"""The backend of merged mode: direct calls into the colocated broker and its storage."""

from mop.backends.local.backend import LocalBackend, open_local_backend
from mop.backends.local.consumer import LocalConsumer
from mop.backends.local.lease import LocalLease
from mop.backends.local.producer import LocalProducer
from mop.backends.local.role import LocalRole
from mop.backends.local.table import LocalTable

__all__ = [
    "LocalBackend",
    "LocalConsumer",
    "LocalLease",
    "LocalProducer",
    "LocalRole",
    "LocalTable",
    "open_local_backend",
]
