"""The log levels of the node's process, read and changed at run time: `GET` and `PUT
/api/v1/log-level` (`mop.observability.logs` does the work)."""

from __future__ import annotations

from mop.admin.context import AdminContext
from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.observability.logs import log_levels, set_log_level

PATH = "/api/v1/log-level"


def add_logging_routes(router: Router, context: AdminContext) -> None:
    async def get_levels(_request: Request) -> Response:
        return json_response(log_levels())

    async def put_level(request: Request) -> Response:
        """`{"level": "DEBUG"}` for the whole process, with `"logger": "mop.mqtt"` for one
        logger and those below it; answers with the levels then in force."""
        body = request.json()
        if not isinstance(body, dict):
            raise HttpError(400, 'the body must be an object, e.g. {"level": "DEBUG"}')
        level, logger = body.get("level"), body.get("logger")
        # Not ASCII: no level, whatever str.upper() makes of it (a dotless i upper-cased is I).
        if not isinstance(level, str) or not level.isascii():
            raise HttpError(400, "level must be a level's name, e.g. DEBUG")
        if logger is not None and (not isinstance(logger, str) or not logger):
            raise HttpError(400, "logger must be a logger's name, e.g. mop.mqtt")
        try:
            set_log_level(level, logger)
        except ValueError as exc:
            raise HttpError(400, str(exc)) from None
        return json_response(log_levels())

    router.add("GET", PATH, get_levels)
    router.add("PUT", PATH, put_level)
