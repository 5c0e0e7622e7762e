"""The security policy in force: the authentication chain and the ACL, loaded from the files
the settings name. A reload builds a new policy; one that cannot be built leaves the old one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from mop.security.acl import AclError, AclRules
from mop.security.authentication import Authenticator
from mop.security.authorization import Authorizer
from mop.security.passwords import PasswordFile, PasswordFileError
from mop.security.tokens import TokenConfigError, TokenVerifier, key_files, load_key_material
from mop.settings import AuthSettings

log = logging.getLogger("mop.security")

# Files larger than this are not security files anyone meant to point mop at.
_MAX_FILE = 64 * 1024 * 1024


class PolicyError(Exception):
    """A security file that cannot be used: one line naming the setting and the problem."""


@dataclass(frozen=True, slots=True)
class SecurityPolicy:
    authenticator: Authenticator
    authorizer: Authorizer


def open_policy() -> SecurityPolicy:
    """Everyone may connect and do anything: a node without security settings (and tests)."""
    return SecurityPolicy(Authenticator(allow_anonymous=True, order=()), Authorizer(None))


def policy_files(settings: AuthSettings) -> tuple[str, ...]:
    """The files a policy is built from, so that a change to any of them reloads it."""
    files = [settings.password_file, settings.acl_file]
    if settings.jwt.enabled:
        files.extend(key_files(settings.jwt))
    return tuple(f for f in files if f)


def load_policy(settings: AuthSettings) -> SecurityPolicy:
    """Read the files `settings` names and build the policy, or raise PolicyError."""
    passwords = None
    if settings.password_file:
        text = _read("auth.password_file", settings.password_file)
        try:
            passwords = PasswordFile.parse(text)
        except PasswordFileError as exc:
            raise PolicyError(f"auth.password_file {settings.password_file}: {exc}") from None
        for warning in passwords.warnings:
            log.warning("auth.password_file %s: %s", settings.password_file, warning)
    rules = None
    if settings.acl_file:
        text = _read("auth.acl_file", settings.acl_file)
        try:
            rules = AclRules.parse(text)
        except AclError as exc:
            raise PolicyError(f"auth.acl_file {settings.acl_file}: {exc}") from None
    tokens = None
    if settings.jwt.enabled:
        try:
            tokens = TokenVerifier(settings.jwt, keys=load_key_material(settings.jwt))
        except TokenConfigError as exc:
            raise PolicyError(str(exc)) from None
    authenticator = Authenticator(
        allow_anonymous=settings.allow_anonymous,
        order=settings.providers,
        passwords=passwords,
        tokens=tokens,
        acl_claim=settings.jwt.acl_claim,
        certificates=settings.certificate_identity,
        proxy_roles=frozenset(settings.proxy_roles),
    )
    return SecurityPolicy(authenticator, Authorizer(rules))


def _read(setting: str, path: str) -> str:
    try:
        with Path(path).open("rb") as file:
            data = file.read(_MAX_FILE + 1)
    except OSError as exc:
        raise PolicyError(f"{setting} {path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > _MAX_FILE:
        raise PolicyError(f"{setting} {path}: larger than {_MAX_FILE} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(
            f"{setting} {path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
