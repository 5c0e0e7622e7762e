"""`mop/admin/openapi.yaml` for tests: its routes, and answers checked against its schemas."""

from __future__ import annotations

from typing import Any


def check_response(method: str, path: str, status: int, body: Any) -> None:
    """Placeholder until the document exists."""
