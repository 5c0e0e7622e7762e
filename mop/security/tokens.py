"""JSON Web Tokens as credentials: an MQTT password or a Pulsar `AuthenticationToken`, checked
against the keys of `auth.jwt`. PyJWT verifies signatures; this module decides which key and
algorithm may verify a token, and checks its claims.

`load_key_material` is the only part that reads files (and raises `TokenConfigError`);
`TokenVerifier` is pure and answers every token with a `VerifiedToken` or a `TokenRejected`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import jwt
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from mop.settings import JwtSettings

if TYPE_CHECKING:
    from jwt.types import Options

# Tokens longer than this are refused before any parsing (a JWT with a few claims is < 1 KiB).
MAX_TOKEN_LENGTH: Final = 16 * 1024
# RFC 7518 section 3.2: an HMAC key at least as long as the hash (HS256: 32 bytes). A longer
# hash needs a longer key; a token whose algorithm wants more than the secret has is refused.
MIN_SECRET_BYTES: Final = 32
MIN_RSA_BITS: Final = 2048
# Key files are small; a bigger one is not a key file.
MAX_KEY_FILE_BYTES: Final = 1024 * 1024

PublicKeyObject = rsa.RSAPublicKey | ec.EllipticCurvePublicKey

# HS* verify with the shared secret and nothing else.
_SECRET_ALGORITHMS: Final = frozenset({"HS256", "HS384", "HS512"})
# The other algorithms verify with public keys only, each with one kind of key (see `_key_kind`).
_PUBLIC_ALGORITHMS: Final[Mapping[str, str]] = {
    "RS256": "RSA",
    "RS384": "RSA",
    "RS512": "RSA",
    "PS256": "RSA",
    "PS384": "RSA",
    "PS512": "RSA",
    "ES256": "EC P-256",
    "ES384": "EC P-384",
    "ES512": "EC P-521",
}
_JOSE_CURVES: Final[Mapping[str, str]] = {
    "secp256r1": "P-256",
    "secp384r1": "P-384",
    "secp521r1": "P-521",
}
# JWK key types mop verifies with, and how PyJWT builds each; other types in a set are skipped.
_JWK_LOADERS: Final[Mapping[str, Callable[[dict[str, Any]], object]]] = {
    "RSA": RSAAlgorithm.from_jwk,
    "EC": ECAlgorithm.from_jwk,
}

# PyJWT checks the signature (and the header's `crit`); the claims are checked here, against
# the caller's clock. Keys shorter than the algorithm wants are an error, never a warning.
_SIGNATURE_ONLY: Final[Options] = {
    "verify_signature": True,
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "verify_sub": False,
    "verify_jti": False,
    "enforce_minimum_key_length": True,
}

# What garbage makes the parsers raise; all of it means "not a token we accept".
_MALFORMED: Final = (
    jwt.PyJWTError,
    ValueError,  # with UnicodeError, binascii.Error and json.JSONDecodeError
    TypeError,
    KeyError,
    OverflowError,
    RecursionError,
    UnsupportedAlgorithm,
)


class TokenConfigError(Exception):
    """A JWT setting or key file that cannot be used, named by its setting (and file)."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(setting, problem)
        self.setting = setting
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.setting}: {self.problem}"


class TokenRejected(Exception):
    """A token that does not authenticate anybody. The message says why, for the log; it never
    holds the token. `expired` is true when the only problem is an `exp` in the past, which
    Pulsar answers with a refresh request and MQTT with its own reason."""

    def __init__(self, why: str, *, expired: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.expired = expired


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """A token whose signature and claims passed every check."""

    # The value of `username_claim` (the Pulsar role).
    subject: str
    # `exp` in epoch seconds; None when the token never expires.
    expires_at: float | None
    # Every claim, read-only (the caller reads `acl_claim` from here).
    claims: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class PublicKey:
    """One verification key: the key of `public_key_file` (no kid, no alg) or one JWK of
    `jwks_file`."""

    key: PublicKeyObject
    kid: str | None = None
    # The JWK's own `alg`: when set, the only algorithm this key verifies.
    alg: str | None = None

    def verifies(self, algorithm: str) -> bool:
        """Whether this key may verify a token signed with `algorithm`."""
        if self.alg is not None and self.alg != algorithm:
            return False
        return _PUBLIC_ALGORITHMS.get(algorithm) == _key_kind(self.key)


@dataclass(frozen=True, slots=True)
class KeyMaterial:
    """What the JWT settings and key files hold, as `load_key_material` read them."""

    public_keys: tuple[PublicKey, ...] = ()
    # The HMAC secret, decoded; kept out of repr so that it never reaches a log line.
    secret: bytes | None = field(default=None, repr=False)


class TokenVerifier:
    """Checks tokens against one set of settings and keys.

    A token passes when its header's `alg` is one that `settings.algorithms` lists and mop
    knows (never `none`), a key of the right kind verifies its signature (HS* with the secret
    only; RS*/PS*/ES* with public keys only, a JWK chosen by `kid`), and its claims hold:
    `nbf` and `exp` (with `leeway`), `iss` and `aud` when the settings name them, and a
    non-empty string in `username_claim`. Keys named in the header (`jwk`, `jku`, `x5u`) are
    never used.
    """

    def __init__(self, settings: JwtSettings, *, keys: KeyMaterial) -> None:
        self._settings = settings
        self._keys = keys
        self._algorithms = frozenset(
            name
            for name in settings.algorithms
            if name in _SECRET_ALGORITHMS or name in _PUBLIC_ALGORITHMS
        )
        self._jwt = jwt.PyJWT(options=_SIGNATURE_ONLY)

    def verify(self, token: str, *, now: float | None = None) -> VerifiedToken:
        """The verified token, or `TokenRejected`; `now` is the epoch time to check `exp` and
        `nbf` against (default: the clock)."""
        try:
            return self._verify(token, time.time() if now is None else now)
        except TokenRejected:
            raise
        except jwt.PyJWTError as exc:
            # PyJWT's reasons may quote a header value (a `crit` name): one line, cut short.
            why = str(exc).encode("unicode_escape").decode("ascii")
            raise TokenRejected(f"invalid token: {why[:200]}") from None
        except _MALFORMED as exc:
            raise TokenRejected(f"malformed token ({type(exc).__name__})") from None

    def _verify(self, token: object, now: float) -> VerifiedToken:
        if not isinstance(token, str):
            raise TokenRejected("the token is not text")
        if len(token) > MAX_TOKEN_LENGTH:
            raise TokenRejected(f"the token is longer than {MAX_TOKEN_LENGTH} characters")
        if not token.isascii():
            raise TokenRejected("the token is not ASCII")
        header = jwt.get_unverified_header(token)
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm not in self._algorithms:
            raise TokenRejected(f"algorithm {_shown(algorithm)} is not accepted")
        key = self._key_for(algorithm, header.get("kid"))
        decoded = self._jwt.decode_complete(token, key, algorithms=[algorithm])
        return self._checked(decoded["payload"], now)

    def _key_for(self, algorithm: str, kid: object) -> bytes | PublicKeyObject:
        """The one key that may verify a token of `algorithm` naming `kid` (or None).

        A key that names itself (a JWK with a kid) is chosen by the token's kid. Otherwise the
        key that names nothing (the PEM key) is used; failing that, the only key that fits.
        """
        if algorithm in _SECRET_ALGORITHMS:
            if self._keys.secret is None:
                raise TokenRejected(f"{algorithm} needs auth.jwt.secret, which is not set")
            return self._keys.secret
        fitting = [key for key in self._keys.public_keys if key.verifies(algorithm)]
        if not fitting:
            raise TokenRejected(f"no public key verifies {algorithm}")
        named = [key for key in fitting if kid is not None and key.kid == kid]
        if named:
            return named[0].key
        unnamed = [key for key in fitting if key.kid is None]
        if len(unnamed) == 1:
            return unnamed[0].key
        if kid is not None:
            raise TokenRejected(f"no {algorithm} key has kid {_shown(kid)}")
        if len(fitting) == 1:
            return fitting[0].key
        raise TokenRejected(f"the token has no kid and {len(fitting)} keys could verify it")

    def _checked(self, claims: dict[str, Any], now: float) -> VerifiedToken:
        """The claims as a `VerifiedToken`, or why not; `exp` is checked last, so `expired`
        is set only when nothing else is wrong."""
        settings = self._settings
        not_before = _numeric_date(claims, "nbf")
        expires_at = _numeric_date(claims, "exp")
        if not_before is not None and not_before > now + settings.leeway:
            raise TokenRejected("the token is not valid yet (nbf)")
        if settings.issuer is not None and claims.get("iss") != settings.issuer:
            raise TokenRejected("the token's issuer (iss) is not the configured one")
        if settings.audience is not None and not _names(claims.get("aud"), settings.audience):
            raise TokenRejected("the token's audience (aud) does not name the configured one")
        subject = claims.get(settings.username_claim)
        if not isinstance(subject, str) or not subject:
            raise TokenRejected(
                f"the claim {settings.username_claim!r} is missing or not a non-empty string"
            )
        if expires_at is not None and now - settings.leeway >= expires_at:
            raise TokenRejected("the token has expired (exp)", expired=True)
        return VerifiedToken(subject, expires_at, types.MappingProxyType(claims))


def _numeric_date(claims: Mapping[str, object], name: str) -> float | None:
    """A time claim as epoch seconds (None when absent); anything but a finite number is
    refused, so that a malformed `exp` never counts as "no expiry"."""
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenRejected(f"the token's {name} is not a number")
    try:
        seconds = float(value)
    except OverflowError:
        raise TokenRejected(f"the token's {name} is out of range") from None
    if not math.isfinite(seconds):
        raise TokenRejected(f"the token's {name} is out of range")
    return seconds


def _names(audience_claim: object, audience: str) -> bool:
    """Whether `aud` (one string or a list of strings) names `audience`."""
    if isinstance(audience_claim, str):
        return audience_claim == audience
    return (
        isinstance(audience_claim, list)
        and all(isinstance(entry, str) for entry in audience_claim)
        and audience in audience_claim
    )


def _shown(value: object) -> str:
    """A header value as a log shows it: strings quoted and cut short, other values by type."""
    if not isinstance(value, str):
        return "(none)" if value is None else f"(a JSON {type(value).__name__})"
    text = repr(value)
    return text if len(text) <= 40 else text[:36] + "...'"


def _key_kind(key: object) -> str:
    """What `_PUBLIC_ALGORITHMS` calls a key: "RSA", "EC P-256", ..."""
    if isinstance(key, rsa.RSAPublicKey):
        return "RSA"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return "EC " + _JOSE_CURVES.get(key.curve.name, key.curve.name)
    return type(key).__name__.lstrip("_").removesuffix("PublicKey")


# --- reading the settings and key files ----------------------------------------------------------


def key_files(settings: JwtSettings) -> tuple[str, ...]:
    """The files `load_key_material` reads, for a reloader to watch."""
    return tuple(path for path in (settings.public_key_file, settings.jwks_file) if path)


def load_key_material(settings: JwtSettings) -> KeyMaterial:
    """The secret and public keys `settings` name, read and checked, or `TokenConfigError`."""
    _check_algorithms(settings.algorithms)
    public_keys: list[PublicKey] = []
    if settings.public_key_file:
        public_keys.append(_load_public_key_file(settings.public_key_file, settings.algorithms))
    if settings.jwks_file:
        public_keys.extend(_load_jwks_file(settings.jwks_file, settings.algorithms))
    return KeyMaterial(public_keys=tuple(public_keys), secret=_secret(settings))


def _check_algorithms(algorithms: Sequence[str]) -> None:
    for name in algorithms:
        if name.lower() == "none":
            raise TokenConfigError(
                "auth.jwt.algorithms", "unsigned tokens (none) are never accepted"
            )
        if name not in _SECRET_ALGORITHMS and name not in _PUBLIC_ALGORITHMS:
            known = ", ".join(sorted(_SECRET_ALGORITHMS) + list(_PUBLIC_ALGORITHMS))
            raise TokenConfigError(
                "auth.jwt.algorithms", f"unknown algorithm {name!r} (known: {known})"
            )


def _secret(settings: JwtSettings) -> bytes | None:
    if not settings.secret:
        return None
    if not settings.secret_base64:
        secret = settings.secret.encode("utf-8")
    else:
        try:
            secret = _decode_base64(settings.secret)
        except (binascii.Error, ValueError):
            raise TokenConfigError(
                "auth.jwt.secret", "not valid base64 (auth.jwt.secret_base64 is true)"
            ) from None
    if len(secret) < MIN_SECRET_BYTES:
        raise TokenConfigError(
            "auth.jwt.secret",
            f"{len(secret)} bytes is too short: HMAC secrets need at least {MIN_SECRET_BYTES}"
            " (RFC 7518 section 3.2)",
        )
    return secret


def _decode_base64(text: str) -> bytes:
    """Standard or URL-safe base64, padded or not, possibly wrapped over lines (one alphabet
    per secret, though)."""
    compact = "".join(text.split())
    if "-" in compact or "_" in compact:
        if "+" in compact or "/" in compact:
            raise ValueError("two base64 alphabets in one secret")
        compact = compact.translate(str.maketrans("-_", "+/"))
    return base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)


def _read(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise TokenConfigError(setting, f"cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise TokenConfigError(setting, f"larger than {MAX_KEY_FILE_BYTES} bytes")
    return data


def _load_public_key_file(path: str, algorithms: Sequence[str]) -> PublicKey:
    """A PEM public key or certificate, or a DER public key (what Pulsar's
    `tokens create-key-pair` writes)."""
    setting = f"auth.jwt.public_key_file {path}"
    data = _read(path, setting)
    if b"PRIVATE KEY-----" in data:
        raise TokenConfigError(setting, "holds a private key; give the public key")
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            key: object = x509.load_pem_x509_certificate(data).public_key()
        elif b"-----BEGIN" in data:
            key = load_pem_public_key(data)
        else:
            key = load_der_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise TokenConfigError(setting, "not a PEM or DER public key") from None
    public_key = _checked_key(key, setting)
    if not any(_PUBLIC_ALGORITHMS.get(name) == _key_kind(public_key) for name in algorithms):
        raise TokenConfigError(
            setting,
            f"holds an {_key_kind(public_key)} key, which no algorithm of auth.jwt.algorithms"
            " verifies with",
        )
    return PublicKey(public_key)


def _checked_key(key: object, setting: str) -> PublicKeyObject:
    """`key` if tokens may be verified with it."""
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey) or (
        _key_kind(key) not in _PUBLIC_ALGORITHMS.values()
    ):
        raise TokenConfigError(
            setting,
            f"holds a {_key_kind(key)} key; tokens verify with RSA or EC P-256/384/521 keys",
        )
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        raise TokenConfigError(
            setting, f"its RSA key has {key.key_size} bits; at least {MIN_RSA_BITS} are needed"
        )
    return key


def _load_jwks_file(path: str, algorithms: Sequence[str]) -> list[PublicKey]:
    """The signing keys of a JWK set that some algorithm of `algorithms` verifies with.

    Keys meant for encryption, and key types or algorithms mop does not verify with, are
    skipped (an identity provider's set may hold them); a broken, private or secret key is an
    error, and so is a set left with no key.
    """
    setting = f"auth.jwt.jwks_file {path}"
    try:
        document = json.loads(_read(path, setting))
    except (ValueError, RecursionError) as exc:
        raise TokenConfigError(setting, f"not JSON ({type(exc).__name__}: {exc})") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise TokenConfigError(setting, 'not a JWK set (no "keys" list)')
    usable: list[PublicKey] = []
    for index, entry in enumerate(entries):
        key = _jwk(entry, index, setting)
        if key is not None and any(key.verifies(name) for name in algorithms):
            usable.append(key)
    if not usable:
        raise TokenConfigError(
            setting, "holds no signing key that an algorithm of auth.jwt.algorithms verifies with"
        )
    return usable


def _jwk(entry: object, index: int, setting: str) -> PublicKey | None:
    """One JWK of a set as a `PublicKey`, None when it is not a key mop verifies with."""
    if not isinstance(entry, dict):
        raise TokenConfigError(setting, f"key {index} is not a JSON object")
    kid = entry.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise TokenConfigError(setting, f"key {index}: its kid is not a string")
    name = f"key {index}" if kid is None else f"key {index} (kid {kid!r})"
    kty, alg, use = entry.get("kty"), entry.get("alg"), entry.get("use")
    if kty == "oct":
        raise TokenConfigError(
            setting, f"{name} is a secret (kty oct); HS* secrets belong in auth.jwt.secret"
        )
    loader = _JWK_LOADERS.get(kty) if isinstance(kty, str) else None
    if use not in (None, "sig") or loader is None:
        return None
    if alg is not None and (not isinstance(alg, str) or alg not in _PUBLIC_ALGORITHMS):
        return None
    if "d" in entry:
        raise TokenConfigError(setting, f"{name} is a private key; publish only public keys")
    try:
        key = loader(entry)
    except (jwt.PyJWTError, ValueError, TypeError, KeyError) as exc:
        raise TokenConfigError(setting, f"{name} is not a valid {kty} key ({exc})") from None
    if _key_kind(key) not in _PUBLIC_ALGORITHMS.values():
        return None
    public_key = _checked_key(key, f"{setting} {name}")
    if alg is not None and _PUBLIC_ALGORITHMS[alg] != _key_kind(public_key):
        raise TokenConfigError(
            setting, f"{name}: alg {alg} needs an {_PUBLIC_ALGORITHMS[alg]} key, not {kty}"
        )
    return PublicKey(public_key, kid, alg)
