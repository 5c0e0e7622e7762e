"""The admin HTTP listener: `/metrics`, `/healthz`, `/readyz`, the JSON admin API under
`/api/v1/` (described by `openapi.yaml` beside this file) and the dashboard page.

`http` is a small ASGI application and router, `server` serves it with hypercorn's trio worker,
and each `routes_*` module adds the routes of one subject, given an `AdminContext`.
"""

from mop.admin.context import AdminContext
from mop.admin.server import bind_admin, build_admin_app, serve_admin

__all__ = ["AdminContext", "bind_admin", "build_admin_app", "serve_admin"]
