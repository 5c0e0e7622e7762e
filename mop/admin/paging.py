"""Paged lists: `?offset=0&limit=100` (limit at most 1000), answered as
`{"items": [...], "total": N, "offset": O, "limit": L}`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from mop.admin.http import Request, Response, json_response

DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000

T = TypeVar("T")


def paged(request: Request, items: Sequence[T], render: Callable[[T], Any]) -> Response:
    """The page of `items` the request asks for, each item rendered as JSON by `render`
    (only those of the page are)."""
    offset = request.int_arg("offset", 0)
    limit = request.int_arg("limit", DEFAULT_LIMIT, high=MAX_LIMIT)
    return json_response(
        {
            "items": [render(item) for item in items[offset : offset + limit]],
            "total": len(items),
            "offset": offset,
            "limit": limit,
        }
    )
