"""The credentials and broker trust of the data source's connections (`ClientSecurity`), as
pulsar-client takes them and as mop's own link (the namespace listing) takes them.

A token file is read again for each connection, and by pulsar-client whenever it needs the
token, so that a token replaced in its file is used from then on.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pulsar

from mop.protocols.pulsar.client import ClientAuth
from mop.spark.options import ClientSecurity

__all__ = ["SecurityError", "client_options", "link_auth"]


class SecurityError(RuntimeError):
    """The credentials or the trusted CAs cannot be loaded (the message names the option)."""


def _token(security: ClientSecurity) -> str:
    if security.token is not None:
        return security.token
    assert security.token_file is not None
    try:
        token = Path(security.token_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecurityError(f"auth_token_file {security.token_file}: {exc}") from None
    if not token:
        raise SecurityError(f"auth_token_file {security.token_file} is empty")
    return token


def client_options(security: ClientSecurity) -> dict[str, Any]:
    """Keyword arguments of `pulsar.Client` for `security`."""
    options: dict[str, Any] = {"tls_validate_hostname": security.tls_validate_hostname}
    if security.tls_trust_certs_file_path is not None:
        options["tls_trust_certs_file_path"] = security.tls_trust_certs_file_path
    if security.method == "token":
        _token(security)  # fail here, with the option's name, rather than inside the client
        if security.token_file is not None:
            options["authentication"] = pulsar.AuthenticationToken(lambda: _token(security))
        else:
            options["authentication"] = pulsar.AuthenticationToken(_token(security))
    elif security.method == "basic":
        assert security.username is not None and security.password is not None
        options["authentication"] = pulsar.AuthenticationBasic(security.username, security.password)
    return options


def link_auth(security: ClientSecurity) -> ClientAuth:
    """What mop's own Pulsar link shows the brokers, and how it checks them, for `security`."""
    try:
        context = ssl.create_default_context(cafile=security.tls_trust_certs_file_path)
    except (OSError, ssl.SSLError) as exc:
        raise SecurityError(
            f"tls_trust_certs_file_path {security.tls_trust_certs_file_path}: {exc}"
        ) from None
    if not security.tls_validate_hostname:
        context.check_hostname = False
    if security.method == "token":
        # With a token file, an AUTH_CHALLENGE is answered with the file's current token.
        return ClientAuth(
            "token", _token(security).encode(), context, token_file=security.token_file
        )
    if security.method == "basic":
        credentials = f"{security.username}:{security.password}".encode()
        return ClientAuth("basic", credentials, context)
    return ClientAuth(ssl_context=context)
