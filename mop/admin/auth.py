"""Who may use the admin API: the guard the application runs before every route but the
public ones (health, readiness, metrics, the page and its files).

Credentials are checked like any client's, by the processor (`authenticate`): HTTP Basic (a
user of the password file) or `Authorization: Bearer <JWT>`. So bans and the limit of failed
logins per address apply to the admin API as to MQTT and Pulsar clients. Once authentication
is configured (`auth.password_file`, `auth.jwt`, or `auth.allow_anonymous = false`), the user
must also be one of `admin.roles`, or, for the part of Pulsar's admin REST API a broker serves
(`/admin/v2/...`), a proxy of the deployment (`auth.proxy_roles`), which asks it for topics;
until then the API is open to whoever reaches it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

from mop.admin.http import HttpError, Request
from mop.processor import MessagingProcessor
from mop.protocols.pulsar.admin_rest import ADMIN_PREFIX
from mop.security.identity import AuthenticationError, AuthFailure, Credentials
from mop.settings import AuthSettings, Settings

# What a browser needs to ask for a user name and password.
CHALLENGE: Final = (("www-authenticate", 'Basic realm="mop"'),)
_PULSAR_ADMIN: Final = ADMIN_PREFIX + "/"


def authentication_configured(settings: AuthSettings) -> bool:
    return bool(settings.password_file or settings.jwt.enabled or not settings.allow_anonymous)


def credentials_of(request: Request) -> Credentials:
    """The credentials of a request's `Authorization` header (none: anonymous), from the
    address it came from. HttpError 401 for a header that is neither Basic nor Bearer."""
    address = request.client.rpartition(":")[0] or request.client
    header = request.headers.get("authorization", "")
    if not header:
        return Credentials(address=address)
    scheme, _, value = header.partition(" ")
    scheme, value = scheme.lower(), value.strip()
    if scheme == "bearer" and value:
        return Credentials(address=address, token=value)
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise HttpError(401, "the Basic credentials are not base64", CHALLENGE) from None
        user, colon, password = decoded.partition(b":")
        if colon:
            try:
                username = user.decode("utf-8")
            except UnicodeDecodeError:
                raise HttpError(401, "the user name is not UTF-8", CHALLENGE) from None
            return Credentials(address=address, username=username, password=password)
        raise HttpError(401, "the Basic credentials have no ':'", CHALLENGE)
    raise HttpError(401, "Authorization must be Basic or Bearer", CHALLENGE)


class AdminGuard:
    """The `Guard` of the admin application (see `mop.admin.http.AsgiApp`)."""

    def __init__(self, settings: Settings, processor: MessagingProcessor) -> None:
        self._processor = processor
        self._required = authentication_configured(settings.auth)
        self._roles = frozenset(settings.admin.roles)

    def __call__(self, request: Request) -> None:
        credentials = credentials_of(request)
        try:
            principal = self._processor.authenticate(credentials)
        except AuthenticationError as exc:
            if exc.failure is AuthFailure.BANNED:
                raise HttpError(403, "refused: banned, or too many failed logins") from None
            raise HttpError(401, "authentication required", CHALLENGE) from None
        if not self._required:
            return
        if principal.name is None:
            raise HttpError(401, "authentication required", CHALLENGE)
        if principal.name in self._roles:
            return
        if principal.is_proxy and request.path.startswith(_PULSAR_ADMIN):
            return
        raise HttpError(403, f"{principal.name!r} is not one of admin.roles")
