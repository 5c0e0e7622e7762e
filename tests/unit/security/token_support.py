"""Keys and token builders shared by the tests of `mop.security.tokens`."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from mop.security.tokens import TokenRejected, TokenVerifier, load_key_material
from mop.settings import JwtSettings

NOW = 1_800_000_000.0
# 64 bytes: long enough for HS512.
SECRET = "0123456789abcdef" * 4
ALL_ALGORITHMS = (
    *("HS256", "HS384", "HS512", "RS256", "RS384", "RS512"),
    *("PS256", "PS384", "PS512", "ES256", "ES384", "ES512"),
)


@functools.cache
def rsa_private_key(number: int = 0) -> rsa.RSAPrivateKey:
    """An RSA 2048 key, the same for one `number` all through a test run."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def ec_private_key() -> ec.EllipticCurvePrivateKey:
    """An EC P-256 key, the same all through a test run."""
    return ec.generate_private_key(ec.SECP256R1())


def pem(key: Any) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def write(directory: Path, name: str, data: bytes | str) -> str:
    path = directory / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


def jwk(key: Any, **members: str) -> dict[str, Any]:
    """The public JWK of a private key, built by PyJWT, with extra members (kid, alg, use)."""
    public = key.public_key()
    algorithm = RSAAlgorithm if isinstance(public, rsa.RSAPublicKey) else ECAlgorithm
    return {**algorithm.to_jwk(public, as_dict=True), **members}


def jwks_settings(directory: Path, *keys: dict[str, Any], **options: Any) -> JwtSettings:
    path = write(directory, "jwks.json", json.dumps({"keys": list(keys)}))
    return JwtSettings(jwks_file=path, **{"algorithms": ALL_ALGORITHMS, **options})


def verifier(settings: JwtSettings) -> TokenVerifier:
    return TokenVerifier(settings, keys=load_key_material(settings))


def claims(**extra: Any) -> dict[str, Any]:
    return {"sub": "alice", "exp": NOW + 60, **extra}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def segment(value: object) -> str:
    return b64(json.dumps(value).encode())


def hmac_token(key: bytes, payload: object, alg: str = "HS256", **header: Any) -> str:
    """A token signed by hand, for keys PyJWT refuses to sign with (a PEM key as a secret)."""
    digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
    signing_input = f"{segment({'alg': alg, **header})}.{segment(payload)}"
    signature = hmac.new(key, signing_input.encode(), digest).digest()
    return f"{signing_input}.{b64(signature)}"


def rejected(checker: TokenVerifier, token: Any, *, now: float = NOW) -> TokenRejected:
    with pytest.raises(TokenRejected) as info:
        checker.verify(token, now=now)
    return info.value


def hs_token(payload: dict[str, Any], alg: str = "HS256") -> str:
    return jwt.encode(payload, SECRET, algorithm=alg)
