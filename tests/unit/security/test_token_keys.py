"""Tests of `load_key_material` and `key_files`: the secret and key files `auth.jwt` names,
read and checked, and the one-line `TokenConfigError` for each thing that cannot be used."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import RSAAlgorithm

from mop.security.tokens import KeyMaterial, TokenConfigError, key_files, load_key_material
from mop.settings import JwtSettings

from .token_support import (
    SECRET,
    b64,
    claims,
    ec_private_key,
    hs_token,
    jwk,
    jwks_settings,
    pem,
    rejected,
    rsa_private_key,
    verifier,
    write,
)


@pytest.fixture(scope="session")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa_private_key()


@pytest.fixture(scope="session")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec_private_key()


def config_error(settings: JwtSettings, *fragments: str) -> str:
    with pytest.raises(TokenConfigError) as info:
        load_key_material(settings)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    return message


def test_key_files_are_the_files_load_key_material_reads() -> None:
    assert key_files(JwtSettings(secret=SECRET)) == ()
    assert key_files(JwtSettings(public_key_file="/k.pem", jwks_file="/j.json")) == (
        "/k.pem",
        "/j.json",
    )


def test_no_keys_configured_means_every_token_is_rejected(rsa_key: rsa.RSAPrivateKey) -> None:
    settings = JwtSettings()
    assert not settings.enabled
    assert load_key_material(settings) == KeyMaterial()
    checker = verifier(settings)
    assert "needs auth.jwt.secret" in str(rejected(checker, hs_token(claims())))
    rs = jwt.encode(claims(), rsa_key, algorithm="RS256")
    assert "no public key" in str(rejected(checker, rs))


def test_the_secret_never_appears_in_a_repr() -> None:
    assert SECRET not in repr(load_key_material(JwtSettings(secret=SECRET)))


@pytest.mark.parametrize(
    "encoded",
    [
        base64.b64encode(SECRET.encode()).decode(),
        base64.urlsafe_b64encode(SECRET.encode()).decode().rstrip("="),
        "\n".join(base64.encodebytes(SECRET.encode()).decode().split("\n")) + "  ",
    ],
    ids=["standard", "urlsafe-unpadded", "wrapped"],
)
def test_a_base64_secret_is_decoded(encoded: str) -> None:
    keys = load_key_material(JwtSettings(secret=encoded, secret_base64=True))
    assert keys.secret == SECRET.encode()


@pytest.mark.parametrize("encoded", ["not base64!", "QUJD=RA==", "a+b-" * 12, "Y"])
def test_a_bad_base64_secret_is_a_config_error(encoded: str) -> None:
    config_error(JwtSettings(secret=encoded, secret_base64=True), "auth.jwt.secret", "base64")


def test_a_short_secret_is_a_config_error() -> None:
    config_error(JwtSettings(secret="s" * 31), "auth.jwt.secret", "31 bytes", "too short")
    short = base64.b64encode(b"s" * 16).decode()
    config_error(JwtSettings(secret=short, secret_base64=True), "16 bytes")


@pytest.mark.parametrize(
    ("name", "why"), [("none", "never"), ("HS1024", "unknown"), ("EdDSA", "unknown")]
)
def test_an_algorithm_mop_does_not_verify_is_a_config_error(name: str, why: str) -> None:
    config_error(JwtSettings(secret=SECRET, algorithms=("HS256", name)), "auth.jwt.algorithms", why)


@pytest.mark.parametrize("setting", ["public_key_file", "jwks_file"])
def test_a_missing_key_file_is_a_config_error(tmp_path: Path, setting: str) -> None:
    path = str(tmp_path / "absent")
    config_error(JwtSettings(**{setting: path}), f"auth.jwt.{setting} {path}", "cannot read it")


@pytest.mark.parametrize(
    "content",
    [
        b"-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----\n",
        b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n",
        os.urandom(64),
        b"",
    ],
)
def test_a_garbage_public_key_file_is_a_config_error(tmp_path: Path, content: bytes) -> None:
    path = write(tmp_path, "k.pem", content)
    config_error(JwtSettings(public_key_file=path), path, "not a PEM or DER public key")


def test_a_private_key_file_is_a_config_error(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    private = rsa_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path = write(tmp_path, "k.pem", private)
    config_error(JwtSettings(public_key_file=path), "private key")


def test_an_unusable_public_key_is_a_config_error(
    tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    ed = write(tmp_path, "ed.pem", pem(ed25519.Ed25519PrivateKey.generate()))
    config_error(JwtSettings(public_key_file=ed), "Ed25519 key")
    weak = write(tmp_path, "weak.pem", pem(rsa.generate_private_key(65537, 1024)))
    config_error(JwtSettings(public_key_file=weak), "1024 bits")
    p256 = write(tmp_path, "p256.pem", pem(ec_key))
    config_error(JwtSettings(public_key_file=p256, algorithms=("RS256", "ES384")), "EC P-256")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        ("[]", 'no "keys" list'),
        ('{"keys": "x"}', 'no "keys" list'),
        ('{"keys": []}', "no signing key"),
        ('{"keys": [1]}', "key 0 is not a JSON object"),
        ('{"keys": [{"kty": "RSA", "kid": 5, "n": "AQAB", "e": "AQAB"}]}', "kid is not a string"),
        ('{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}', "kty oct"),
        ('{"keys": [{"kty": "RSA", "kid": "b", "n": "!!", "e": "AQAB"}]}', "not a valid RSA key"),
        ('{"keys": [{"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"}]}', "not a valid EC key"),
        ('{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "AA"}]}', "no signing key"),
    ],
)
def test_a_bad_jwks_file_is_a_config_error(tmp_path: Path, content: str | bytes, why: str) -> None:
    path = write(tmp_path, "jwks.json", content)
    config_error(JwtSettings(jwks_file=path), f"auth.jwt.jwks_file {path}", why)


def test_unusable_jwks_keys_are_errors_or_skipped(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    private = {**RSAAlgorithm.to_jwk(rsa_key, as_dict=True), "kid": "p"}
    config_error(jwks_settings(tmp_path, private), "kid 'p'", "private key")
    config_error(jwks_settings(tmp_path, jwk(ec_key, alg="RS256")), "alg RS256 needs an RSA key")
    weak = jwk(rsa.generate_private_key(65537, 1024), kid="w")
    config_error(jwks_settings(tmp_path, weak), "kid 'w'", "1024 bits")
    only_encryption = jwks_settings(tmp_path, jwk(rsa_key, use="enc"), jwk(ec_key, alg="RSA-OAEP"))
    config_error(only_encryption, "no signing key")
    not_allowed = jwks_settings(tmp_path, jwk(ec_key), algorithms=("RS256",))
    config_error(not_allowed, "no signing key")
    okp = {"kty": "OKP", "crv": "Ed25519", "x": b64(bytes(32))}
    mixed = jwks_settings(tmp_path, okp, jwk(rsa_key, use="enc"), jwk(ec_key, kid="e1"))
    assert [key.kid for key in load_key_material(mixed).public_keys] == ["e1"]
