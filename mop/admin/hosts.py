"""Which `Host` the admin listener answers to: the defence against DNS rebinding.

A page of any site can point its own host name at 127.0.0.1 once loaded (DNS rebinding): the
browser then takes the node's loopback listener for that site, and its requests for
same-origin ones, so the page could read and change everything an open node serves. Those
requests name the page's host in `Host`, so a listener on loopback answers only requests that
name a loopback host (`localhost`, `127.0.0.1`, `[::1]` or `admin.host` itself, on any port).
A listener on another address answers any host unless `admin.allowed_hosts` names them. The
health checks (`/healthz`, `/readyz`) answer whatever the host: load balancers send odd ones.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Final

from mop.admin.http import HttpError
from mop.settings import AdminSettings

__all__ = ["ANY_HOST", "HostGuard", "allowed_hosts", "host_name", "is_loopback"]

# The answer to a request for a host this listener does not serve (RFC 9110, 15.5.20).
MISDIRECTED: Final = 421
# In `admin.allowed_hosts`: answer any host.
ANY_HOST: Final = "*"
_LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(host: str) -> str:
    """A host as compared: lower-case, without port, IPv6 brackets or a final dot
    ("LocalHost.:8080" is "localhost", "[::1]:80" is "::1")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") names this machine's loopback interface."""
    name = host_name(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(settings: AdminSettings) -> frozenset[str] | None:
    """The host names (see `host_name`) requests may name; None: any."""
    if settings.allowed_hosts:
        names = frozenset(host_name(host) for host in settings.allowed_hosts)
        return None if ANY_HOST in names else names
    if is_loopback(settings.host):
        return _LOOPBACK_NAMES | {host_name(settings.host)}
    return None


class HostGuard:
    """The `HostCheck` of the admin application (see `mop.admin.http.AsgiApp`): HttpError 421
    for a request whose `Host` is not one of `allowed` (None: any is). A request that names
    none (HTTP/1.0) is answered: browsers always name one."""

    def __init__(self, allowed: frozenset[str] | None) -> None:
        self.allowed = allowed

    @classmethod
    def of(cls, settings: AdminSettings) -> HostGuard:
        return cls(allowed_hosts(settings))

    def __call__(self, headers: Mapping[str, str]) -> None:
        if self.allowed is None:
            return
        host = headers.get("host")
        if host is None or host_name(host) in self.allowed:
            return
        raise HttpError(
            MISDIRECTED,
            f"refused: this node does not answer for the host {host[:200]!r}"
            " (admin.allowed_hosts; on loopback: localhost, 127.0.0.1 or [::1])",
        )
