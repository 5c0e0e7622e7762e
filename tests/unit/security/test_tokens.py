"""Tests of `TokenVerifier`: which tokens verify (each algorithm family, with a PEM key, a DER
key, a certificate or a JWK set), every check that refuses one, and the bound on garbage."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from mop.security.tokens import (
    MAX_TOKEN_LENGTH,
    KeyMaterial,
    TokenRejected,
    TokenVerifier,
    VerifiedToken,
    load_key_material,
)
from mop.settings import JwtSettings

from .token_support import (
    ALL_ALGORITHMS,
    NOW,
    SECRET,
    b64,
    claims,
    ec_private_key,
    hmac_token,
    hs_token,
    jwk,
    jwks_settings,
    pem,
    rejected,
    rsa_private_key,
    segment,
    verifier,
    write,
)


@pytest.fixture(scope="session")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa_private_key()


@pytest.fixture(scope="session")
def other_rsa_key() -> rsa.RSAPrivateKey:
    return rsa_private_key(1)


@pytest.fixture(scope="session")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec_private_key()


@pytest.fixture
def hs() -> TokenVerifier:
    return verifier(JwtSettings(secret=SECRET))


# --- tokens that verify --------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512"])
def test_hs_algorithms_verify_with_the_secret(alg: str) -> None:
    checker = verifier(JwtSettings(secret=SECRET, algorithms=(alg,)))
    assert checker.verify(hs_token(claims(), alg), now=NOW).subject == "alice"


@pytest.mark.parametrize(
    ("alg", "key_name"),
    [("RS256", "rsa_key"), ("RS512", "rsa_key"), ("PS256", "rsa_key"), ("ES256", "ec_key")],
)
def test_public_key_algorithms_verify_with_a_pem_key(
    alg: str, key_name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    key = request.getfixturevalue(key_name)
    settings = JwtSettings(public_key_file=write(tmp_path, "key.pem", pem(key)), algorithms=(alg,))
    token = jwt.encode(claims(), key, algorithm=alg)
    assert verifier(settings).verify(token, now=NOW).subject == "alice"


def test_a_verified_token_carries_its_subject_expiry_and_claims(hs: TokenVerifier) -> None:
    acl = {"pub": ["a/#"], "sub": ["b/+"]}
    verified = hs.verify(hs_token(claims(acl=acl, exp=NOW + 0.5)), now=NOW)
    assert verified == VerifiedToken("alice", NOW + 0.5, verified.claims)
    assert verified.claims["acl"] == acl
    with pytest.raises(TypeError):
        verified.claims["sub"] = "mallory"  # type: ignore[index]


def test_a_token_without_exp_never_expires(hs: TokenVerifier) -> None:
    assert hs.verify(hs_token({"sub": "alice"}), now=NOW).expires_at is None


def test_the_username_claim_is_configurable() -> None:
    checker = verifier(JwtSettings(secret=SECRET, username_claim="preferred_username"))
    token = hs_token(claims(preferred_username="bob"))
    assert checker.verify(token, now=NOW).subject == "bob"
    assert "'preferred_username'" in str(rejected(checker, hs_token(claims())))


def test_now_defaults_to_the_clock(hs: TokenVerifier) -> None:
    assert hs.verify(hs_token(claims(exp=time.time() + 60))).subject == "alice"
    assert rejected(hs, hs_token(claims(exp=time.time() - 60)), now=time.time()).expired


def test_a_token_made_like_pulsars_tokens_create_verifies(tmp_path: Path) -> None:
    # `pulsar tokens create-secret-key --base64` writes 32 random bytes in standard base64;
    # `pulsar tokens create --secret-key ... --subject ROLE` signs {"sub": ROLE} (plus an
    # integer "exp" with --expiry-time) with HS256 under the header {"alg": "HS256"}.
    key = os.urandom(32)
    settings = JwtSettings(secret=base64.b64encode(key).decode(), secret_base64=True)
    token = jwt.encode({"sub": "test-user"}, key, algorithm="HS256", headers={"typ": None})
    assert jwt.get_unverified_header(token) == {"alg": "HS256"}
    assert verifier(settings).verify(token, now=NOW) == VerifiedToken(
        "test-user", None, {"sub": "test-user"}
    )
    expiring = jwt.encode({"sub": "test-user", "exp": int(NOW) + 3600}, key, algorithm="HS256")
    assert verifier(settings).verify(expiring, now=NOW).expires_at == NOW + 3600


def test_a_pulsar_der_public_key_verifies_rs256(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    # `pulsar tokens create-key-pair` writes the public key as DER (SubjectPublicKeyInfo).
    der = rsa_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    settings = JwtSettings(public_key_file=write(tmp_path, "my-public.key", der))
    token = jwt.encode({"sub": "test-user"}, rsa_key, algorithm="RS256")
    assert verifier(settings).verify(token, now=NOW).subject == "test-user"


def test_a_pem_certificate_verifies_with_its_public_key(
    tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer")])
    start = datetime(2026, 1, 1, tzinfo=UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ec_key.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=1))
        .sign(ec_key, hashes.SHA256())
    )
    path = write(tmp_path, "cert.pem", certificate.public_bytes(serialization.Encoding.PEM))
    token = jwt.encode(claims(), ec_key, algorithm="ES256")
    assert verifier(JwtSettings(public_key_file=path)).verify(token, now=NOW).subject == "alice"


# --- exp and nbf ---------------------------------------------------------------------------------


@pytest.mark.parametrize("exp", [NOW - 1, NOW])
def test_an_expired_token_is_rejected_as_expired(hs: TokenVerifier, exp: float) -> None:
    problem = rejected(hs, hs_token(claims(exp=exp)))
    assert problem.expired
    assert "expired" in str(problem)


def test_leeway_applies_to_exp() -> None:
    token = hs_token(claims(exp=NOW - 5))
    assert verifier(JwtSettings(secret=SECRET, leeway=10)).verify(token, now=NOW)
    assert rejected(verifier(JwtSettings(secret=SECRET, leeway=4)), token).expired


def test_a_token_before_its_nbf_is_rejected(hs: TokenVerifier) -> None:
    assert hs.verify(hs_token(claims(nbf=NOW)), now=NOW)
    problem = rejected(hs, hs_token(claims(nbf=NOW + 1)))
    assert not problem.expired
    assert "nbf" in str(problem)


def test_leeway_applies_to_nbf() -> None:
    token = hs_token(claims(nbf=NOW + 5))
    assert verifier(JwtSettings(secret=SECRET, leeway=10)).verify(token, now=NOW)
    assert "nbf" in str(rejected(verifier(JwtSettings(secret=SECRET, leeway=4)), token))


@pytest.mark.parametrize(
    "problem",
    [{"nbf": NOW + 10}, {"iss": "elsewhere"}, {"sub": ""}],
    ids=["nbf", "iss", "sub"],
)
def test_expired_is_set_only_when_nothing_else_is_wrong(problem: dict[str, Any]) -> None:
    checker = verifier(JwtSettings(secret=SECRET, issuer="https://auth.example"))
    payload = {**claims(exp=NOW - 10, iss="https://auth.example"), **problem}
    assert not rejected(checker, hs_token(payload)).expired


@pytest.mark.parametrize(
    ("claim", "value", "why"),
    [
        ("exp", "tomorrow", "not a number"),
        ("exp", True, "not a number"),
        ("exp", None, "not a number"),
        ("exp", 10**400, "out of range"),
        ("exp", float("inf"), "out of range"),
        ("exp", float("nan"), "out of range"),
        ("nbf", "now", "not a number"),
        ("nbf", [NOW], "not a number"),
    ],
)
def test_a_malformed_time_claim_is_rejected(
    hs: TokenVerifier, claim: str, value: object, why: str
) -> None:
    problem = rejected(hs, hs_token(claims(**{claim: value})))
    assert claim in str(problem)
    assert why in str(problem)
    assert not problem.expired


# --- iss, aud and the subject --------------------------------------------------------------------


def test_the_issuer_is_checked_when_configured() -> None:
    checker = verifier(JwtSettings(secret=SECRET, issuer="https://auth.example"))
    assert checker.verify(hs_token(claims(iss="https://auth.example")), now=NOW)
    for payload in (claims(iss="https://evil.example"), claims(), claims(iss=["x"])):
        assert "issuer" in str(rejected(checker, hmac_token(SECRET.encode(), payload)))
    assert verifier(JwtSettings(secret=SECRET)).verify(hs_token(claims(iss="any")), now=NOW)


@pytest.mark.parametrize("aud", ["mop", ["other", "mop"]])
def test_the_audience_may_be_a_string_or_a_list(aud: object) -> None:
    checker = verifier(JwtSettings(secret=SECRET, audience="mop"))
    assert checker.verify(hs_token(claims(aud=aud)), now=NOW)


@pytest.mark.parametrize("aud", ["other", ["other"], [], ["mop", 1], {"mop": 1}, None, "MOP"])
def test_a_token_for_another_audience_is_rejected(aud: object) -> None:
    checker = verifier(JwtSettings(secret=SECRET, audience="mop"))
    assert "audience" in str(rejected(checker, hs_token(claims(aud=aud))))
    assert "audience" in str(rejected(checker, hs_token(claims())))


def test_the_audience_is_not_checked_when_not_configured(hs: TokenVerifier) -> None:
    assert hs.verify(hs_token(claims(aud="someone-else")), now=NOW)


@pytest.mark.parametrize("subject", ["", 42, ["alice"], {"name": "alice"}, None, True])
def test_the_subject_must_be_a_non_empty_string(hs: TokenVerifier, subject: object) -> None:
    assert "'sub'" in str(rejected(hs, hs_token(claims(sub=subject))))


def test_a_token_without_a_subject_is_rejected(hs: TokenVerifier) -> None:
    assert "'sub'" in str(rejected(hs, hs_token({"exp": NOW + 60})))


# --- signatures ----------------------------------------------------------------------------------


def test_a_token_signed_with_another_secret_is_rejected(hs: TokenVerifier) -> None:
    token = jwt.encode(claims(), "another secret of at least 32 bytes", algorithm="HS256")
    assert "Signature verification failed" in str(rejected(hs, token))


def flip(text: str, index: int) -> str:
    return text[:index] + ("A" if text[index] != "A" else "B") + text[index + 1 :]


def test_a_tampered_payload_is_rejected(hs: TokenVerifier) -> None:
    header, _, signature = hs_token(claims()).split(".")
    forged = f"{header}.{segment(claims(sub='admin'))}.{signature}"
    assert "Signature verification failed" in str(rejected(hs, forged))


@pytest.mark.parametrize("alg", ["HS256", "RS256", "ES256"])
def test_a_tampered_signature_is_rejected(
    alg: str, tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    key: Any = {"HS256": SECRET, "RS256": rsa_key, "ES256": ec_key}[alg]
    key_file = write(tmp_path, "k.pem", pem(ec_key if alg == "ES256" else rsa_key))
    settings = JwtSettings(secret=SECRET, public_key_file=key_file)
    header, payload, signature = jwt.encode(claims(), key, algorithm=alg).split(".")
    forged = f"{header}.{payload}.{flip(signature, 10)}"
    assert "Signature verification failed" in str(rejected(verifier(settings), forged))


def test_a_token_signed_by_another_rsa_key_is_rejected(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey
) -> None:
    settings = JwtSettings(public_key_file=write(tmp_path, "k.pem", pem(rsa_key)))
    token = jwt.encode(claims(), other_rsa_key, algorithm="RS256")
    assert "Signature verification failed" in str(rejected(verifier(settings), token))


# --- algorithms ----------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_unsigned_tokens_are_rejected_even_when_the_settings_list_none(alg: str) -> None:
    token = f"{segment({'alg': alg, 'typ': 'JWT'})}.{segment(claims())}."
    listing_none = JwtSettings(secret=SECRET, algorithms=("none", "None", "NONE", "HS256"))
    keys = KeyMaterial(secret=SECRET.encode())
    for checker in (verifier(JwtSettings(secret=SECRET)), TokenVerifier(listing_none, keys=keys)):
        assert "not accepted" in str(rejected(checker, token))


def test_an_hs_token_keyed_with_the_public_key_is_rejected(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    # Algorithm confusion: the public key is no secret, so an HS token made with it as the
    # HMAC key must never verify.
    public_pem = pem(rsa_key)
    key_file = write(tmp_path, "k.pem", public_pem)
    forged = hmac_token(public_pem, claims())
    public_only = verifier(JwtSettings(public_key_file=key_file))
    assert "needs auth.jwt.secret" in str(rejected(public_only, forged))
    both = verifier(JwtSettings(secret=SECRET, public_key_file=key_file))
    assert "Signature verification failed" in str(rejected(both, forged))


def test_an_hs_token_keyed_with_a_jwk_set_is_rejected(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    settings = jwks_settings(tmp_path, jwk(rsa_key, kid="r1"))
    checker = verifier(settings)
    assert settings.jwks_file is not None
    for key in (Path(settings.jwks_file).read_bytes(), json.dumps(jwk(rsa_key)).encode()):
        assert "needs auth.jwt.secret" in str(rejected(checker, hmac_token(key, claims())))


def test_an_rs_token_is_rejected_by_a_secret_only_config(
    hs: TokenVerifier, rsa_key: rsa.RSAPrivateKey
) -> None:
    token = jwt.encode(claims(), rsa_key, algorithm="RS256")
    assert "no public key verifies RS256" in str(rejected(hs, token))


def test_a_key_of_the_wrong_kind_is_not_used(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    ec_only = verifier(
        JwtSettings(
            public_key_file=write(tmp_path, "e.pem", pem(ec_key)), algorithms=ALL_ALGORITHMS
        )
    )
    token = jwt.encode(claims(), rsa_key, algorithm="RS256")
    assert "no public key verifies RS256" in str(rejected(ec_only, token))
    # A P-256 key verifies ES256 only, not ES384 (which wants P-384).
    p384 = ec.generate_private_key(ec.SECP384R1())
    assert "no public key verifies ES384" in str(
        rejected(ec_only, jwt.encode(claims(), p384, algorithm="ES384"))
    )


@pytest.mark.parametrize("alg", ["HS512", "RS384", "PS256"])
def test_an_algorithm_the_settings_do_not_list_is_rejected(
    alg: str, tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    key_file = write(tmp_path, "k.pem", pem(rsa_key))
    allowed = ("HS256", "RS256")
    checker = verifier(JwtSettings(secret=SECRET, public_key_file=key_file, algorithms=allowed))
    token = jwt.encode(claims(), SECRET if alg.startswith("HS") else rsa_key, algorithm=alg)
    assert f"algorithm '{alg}' is not accepted" in str(rejected(checker, token))


def test_a_secret_shorter_than_the_algorithm_wants_is_not_used() -> None:
    checker = verifier(JwtSettings(secret="s" * 32))
    assert checker.verify(hmac_token(b"s" * 32, claims()), now=NOW)
    problem = rejected(checker, hmac_token(b"s" * 32, claims(), alg="HS512"))
    assert "32 bytes" in str(problem)


def test_header_values_are_checked_before_use(hs: TokenVerifier) -> None:
    rest = f"{segment(claims())}.{b64(b'signature')}"
    assert "(a JSON list)" in str(rejected(hs, f"{segment({'alg': ['HS256']})}.{rest}"))
    assert "(none)" in str(rejected(hs, f"{segment({'typ': 'JWT'})}.{rest}"))
    assert "Key ID" in str(rejected(hs, hmac_token(SECRET.encode(), claims(), kid=7)))
    assert "crit" in str(rejected(hs, hmac_token(SECRET.encode(), claims(), crit=["exp"])))
    odd_name = ["line\nbreak" + "x" * 1000]
    why = str(rejected(hs, hmac_token(SECRET.encode(), claims(), crit=odd_name)))
    assert "\n" not in why
    assert len(why) < 300


# --- JWK sets ------------------------------------------------------------------------------------


@pytest.fixture
def jwks(
    tmp_path: Path,
    rsa_key: rsa.RSAPrivateKey,
    other_rsa_key: rsa.RSAPrivateKey,
    ec_key: ec.EllipticCurvePrivateKey,
) -> TokenVerifier:
    return verifier(
        jwks_settings(
            tmp_path,
            jwk(rsa_key, kid="r1", alg="RS256", use="sig"),
            jwk(other_rsa_key, kid="r2"),
            jwk(ec_key, kid="e1"),
        )
    )


def test_a_jwk_is_chosen_by_kid(
    jwks: TokenVerifier,
    rsa_key: rsa.RSAPrivateKey,
    other_rsa_key: rsa.RSAPrivateKey,
    ec_key: ec.EllipticCurvePrivateKey,
) -> None:
    for key, kid, alg in [
        (rsa_key, "r1", "RS256"),
        (other_rsa_key, "r2", "PS512"),
        (ec_key, "e1", "ES256"),
    ]:
        token = jwt.encode(claims(), key, algorithm=alg, headers={"kid": kid})
        assert jwks.verify(token, now=NOW).subject == "alice"
    wrong_key = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "r2"})
    assert "Signature verification failed" in str(rejected(jwks, wrong_key))


def test_an_unknown_kid_is_rejected(jwks: TokenVerifier, rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "r9"})
    assert "no RS256 key has kid 'r9'" in str(rejected(jwks, token))


def test_a_jwk_with_an_alg_verifies_only_that_alg(
    jwks: TokenVerifier, rsa_key: rsa.RSAPrivateKey
) -> None:
    token = jwt.encode(claims(), rsa_key, algorithm="PS256", headers={"kid": "r1"})
    assert "no PS256 key has kid 'r1'" in str(rejected(jwks, token))


def test_a_token_without_kid_uses_the_only_key_that_fits(
    jwks: TokenVerifier, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    assert jwks.verify(jwt.encode(claims(), ec_key, algorithm="ES256"), now=NOW)
    token = jwt.encode(claims(), rsa_key, algorithm="RS256")
    assert "has no kid and 2 keys could verify it" in str(rejected(jwks, token))


def test_several_keys_without_kid_verify_no_token_without_kid(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey
) -> None:
    checker = verifier(jwks_settings(tmp_path, jwk(rsa_key), jwk(other_rsa_key)))
    token = jwt.encode(claims(), rsa_key, algorithm="RS256")
    assert "has no kid and 2 keys could verify it" in str(rejected(checker, token))
    token = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "any"})
    assert "no RS256 key has kid 'any'" in str(rejected(checker, token))


def test_the_pem_key_serves_tokens_that_name_no_jwk(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey
) -> None:
    settings = jwks_settings(
        tmp_path,
        jwk(other_rsa_key, kid="r2"),
        public_key_file=write(tmp_path, "k.pem", pem(rsa_key)),
    )
    checker = verifier(settings)
    for headers in ({}, {"kid": "unknown"}):
        token = jwt.encode(claims(), rsa_key, algorithm="RS256", headers=headers)
        assert checker.verify(token, now=NOW)
    token = jwt.encode(claims(), other_rsa_key, algorithm="RS256", headers={"kid": "r2"})
    assert checker.verify(token, now=NOW)


# --- the bound on input, and garbage -------------------------------------------------------------


def test_a_token_longer_than_the_bound_is_rejected_before_parsing(hs: TokenVerifier) -> None:
    def padded(size: int) -> str:
        return hs_token(claims(filler="x" * size))

    size = (MAX_TOKEN_LENGTH - len(padded(0))) * 3 // 4
    while len(padded(size)) > MAX_TOKEN_LENGTH:
        size -= 1
    assert MAX_TOKEN_LENGTH - 4 <= len(padded(size)) <= MAX_TOKEN_LENGTH
    assert hs.verify(padded(size), now=NOW)
    problem = rejected(hs, padded(size + 3))
    assert f"longer than {MAX_TOKEN_LENGTH}" in str(problem)


@pytest.mark.parametrize("token", [None, 42, ["a.b.c"]])
def test_a_token_that_is_not_text_is_rejected(hs: TokenVerifier, token: object) -> None:
    assert "not text" in str(rejected(hs, token))
    assert "not text" in str(rejected(hs, hs_token(claims()).encode()))


def test_a_token_that_is_not_ascii_is_rejected(hs: TokenVerifier) -> None:
    token = hs_token(claims())
    assert "not ASCII" in str(rejected(hs, token[:-1] + "é"))
    assert "not ASCII" in str(rejected(hs, token + "\u200b"))


def test_a_deeply_nested_header_is_rejected(hs: TokenVerifier) -> None:
    lists = b"[" * 5000 + b"]" * 5000
    objects = b'{"a":' * 1500 + b"1" + b"}" * 1500
    for header in (lists, objects):
        token = f"{b64(header)}.{segment(claims())}.x"
        assert len(token) <= MAX_TOKEN_LENGTH
        rejected(hs, token)


def test_rejections_never_echo_the_token(hs: TokenVerifier, rsa_key: rsa.RSAPrivateKey) -> None:
    tokens = [
        hs_token(claims(exp=NOW - 1)),
        hs_token(claims(sub="")),
        jwt.encode(claims(), "another secret of at least 32 bytes", algorithm="HS256"),
        jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "k" * 100}),
        hs_token(claims())[:-5],
        hs_token(claims()).replace(".", "!", 1),
    ]
    for token in tokens:
        why = str(rejected(hs, token))
        assert all(part not in why for part in token.split(".") if len(part) >= 8), why


@pytest.fixture(scope="session")
def fuzz_verifier(
    tmp_path_factory: pytest.TempPathFactory,
    rsa_key: rsa.RSAPrivateKey,
    other_rsa_key: rsa.RSAPrivateKey,
    ec_key: ec.EllipticCurvePrivateKey,
) -> TokenVerifier:
    """Every kind of key at once, and settings that even list `none`."""
    directory = tmp_path_factory.mktemp("fuzz")
    settings = jwks_settings(
        directory,
        jwk(other_rsa_key, kid="r2"),
        jwk(ec_key, kid="e1", alg="ES256"),
        secret=SECRET,
        public_key_file=write(directory, "k.pem", pem(rsa_key)),
        issuer="iss",
        audience="aud",
        leeway=5.0,
    )
    keys = load_key_material(settings)
    listing_none = dataclasses.replace(settings, algorithms=(*ALL_ALGORITHMS, "none"))
    return TokenVerifier(listing_none, keys=keys)


def verified_or_rejected(checker: TokenVerifier, token: Any) -> VerifiedToken | None:
    """The only two outcomes a token may have."""
    try:
        verified = checker.verify(token, now=NOW)
    except TokenRejected as problem:
        assert isinstance(problem.expired, bool)
        assert "\n" not in str(problem)
        return None
    assert isinstance(verified.subject, str) and verified.subject
    assert verified.expires_at is None or verified.expires_at > NOW - 5.0
    return verified


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
headers = st.fixed_dictionaries(
    {"alg": st.sampled_from([*ALL_ALGORITHMS, "none", "EdDSA", "", "hs256"]) | json_values},
    optional={
        "kid": st.sampled_from(["r2", "e1", "nope"]) | json_values,
        "typ": json_values,
        "crit": json_values,
        "b64": json_values,
        "jwk": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(
    token=st.text(max_size=300) | st.binary(max_size=300).map(lambda data: data.decode("latin-1"))
)
def test_random_text_is_rejected(fuzz_verifier: TokenVerifier, token: str) -> None:
    assert verified_or_rejected(fuzz_verifier, token) is None


@settings(max_examples=300, deadline=None)
@given(header=headers | json_values, payload=json_values, signature=st.binary(max_size=300))
def test_random_segments_are_rejected(
    fuzz_verifier: TokenVerifier, header: object, payload: object, signature: bytes
) -> None:
    token = f"{segment(header)}.{segment(payload)}.{b64(signature)}"
    assert verified_or_rejected(fuzz_verifier, token) is None


@settings(max_examples=300, deadline=None)
@given(
    payload=st.fixed_dictionaries(
        {},
        optional={
            "sub": st.just("alice") | json_values,
            "exp": st.floats(NOW - 100, NOW + 100) | json_values,
            "nbf": st.floats(NOW - 100, NOW + 100) | json_values,
            "iss": st.just("iss") | json_values,
            "aud": st.sampled_from(["aud", ["x", "aud"]]) | json_values,
            "acl": json_values,
        },
    ),
    alg=st.sampled_from(["HS256", "HS384", "HS512"]),
)
def test_signed_random_claims_verify_or_are_rejected(
    fuzz_verifier: TokenVerifier, payload: dict[str, Any], alg: str
) -> None:
    verified = verified_or_rejected(fuzz_verifier, hmac_token(SECRET.encode(), payload, alg))
    if verified is not None:
        assert verified.subject == payload["sub"]
        assert payload["iss"] == "iss"


@settings(max_examples=300, deadline=None)
@given(data=st.data(), alg=st.sampled_from(["HS256", "RS256", "ES256"]))
def test_damaged_tokens_are_rejected(
    fuzz_verifier: TokenVerifier,
    rsa_key: rsa.RSAPrivateKey,
    ec_key: ec.EllipticCurvePrivateKey,
    data: st.DataObject,
    alg: str,
) -> None:
    key: Any = {"HS256": SECRET, "RS256": rsa_key, "ES256": ec_key}[alg]
    token = jwt.encode(claims(iss="iss", aud="aud"), key, algorithm=alg)
    assert verified_or_rejected(fuzz_verifier, token) is not None
    cut = data.draw(st.integers(0, len(token) - 1))
    assert verified_or_rejected(fuzz_verifier, token[:cut]) is None
    at = data.draw(st.integers(0, len(token)))
    junk = data.draw(st.text(alphabet="=!+/-_.A \x00é", min_size=1, max_size=3))
    damaged = token[:at] + junk + token[at:]
    verified = verified_or_rejected(fuzz_verifier, damaged)
    # Trailing "=" padding on a segment is tolerated; nothing else is.
    assert verified is None or damaged.replace("=", "") == token
