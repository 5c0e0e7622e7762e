"""The deployment's bans (client ids, user names, addresses and networks), as `mop ban`
keeps them: list, add (clients it covers are disconnected at once, on every node), lift."""

from __future__ import annotations

import math
import time
from typing import Any, Final

from mop.admin.context import AdminContext
from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.admin.paging import paged
from mop.processor import BackendError
from mop.security.abuse import BAN_KINDS, Ban, checked_ban, parse_ban_target
from mop.security.ban_store import BanStore

_FIELDS = frozenset({"kind", "value", "for", "reason"})
MAX_BAN_SECONDS: Final = 100 * 365 * 86400


def ban_doc(ban: Ban) -> dict[str, Any]:
    return {
        "kind": ban.kind,
        "value": ban.value,
        "until": ban.until,
        "reason": ban.reason,
        "created_at": ban.created_at,
    }


def ban_of(body: Any, now: float) -> Ban:
    """The ban a `POST /api/v1/bans` body describes; HttpError 400 when it is not one."""
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise HttpError(400, f"unknown fields: {', '.join(unknown)}")
    kind, value = body.get("kind"), body.get("value")
    reason = body.get("reason", "manual")
    seconds = body.get("for")
    if not isinstance(kind, str) or not isinstance(value, str) or not isinstance(reason, str):
        raise HttpError(400, "kind, value and reason must be strings")
    if seconds is not None and (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= MAX_BAN_SECONDS
        or not math.isfinite(seconds)
    ):
        raise HttpError(400, "for must be a positive number of seconds (null: until lifted)")
    until = None if seconds is None else now + seconds
    try:
        target_kind, target = parse_ban_target(kind, value)
        return checked_ban(Ban(target_kind, target, until, reason, now))
    except ValueError as exc:
        raise HttpError(400, str(exc)) from None


def add_bans_routes(router: Router, context: AdminContext) -> None:
    def store() -> BanStore:
        if context.bans is None:
            raise HttpError(404, "this node keeps no bans")
        return context.bans

    async def list_bans(request: Request) -> Response:
        return paged(request, store().bans.entries(time.time()), ban_doc)

    async def add_ban(request: Request) -> Response:
        ban = ban_of(request.json(), time.time())
        try:
            stored = await store().add(ban)
        except BackendError as exc:
            raise HttpError(503, f"ban not stored: {exc}") from None
        # Clients it covers are closed here now; other nodes follow the table.
        context.processor.gatekeeper.bans_added()
        return json_response(ban_doc(stored), 201)

    async def lift_ban(request: Request) -> Response:
        kind, value = request.params["kind"], request.params["value"]
        if kind not in BAN_KINDS:
            raise HttpError(400, f"unknown ban kind {kind!r}: clientid, username or address")
        try:
            target_kind, target = parse_ban_target(kind, value)
        except ValueError as exc:
            # No ban can name it (an address that is none, say): there is none to lift.
            raise HttpError(404, f"no such ban: {exc}") from None
        try:
            lifted = await store().remove(target_kind, target)
        except BackendError as exc:
            raise HttpError(503, f"ban not lifted: {exc}") from None
        if not lifted:
            raise HttpError(404, f"no ban of {target_kind} {target}")
        return Response(204)

    router.add("GET", "/api/v1/bans", list_bans)
    router.add("POST", "/api/v1/bans", add_ban)
    router.add("DELETE", "/api/v1/bans/{kind}/{value}", lift_ban)
