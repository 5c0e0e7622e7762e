"""The authentication chain, the authorizer and the gatekeeper around them (pure, no network)."""

from __future__ import annotations

import jwt
import pytest

from mop.security.acl import Access, AclRules
from mop.security.authentication import Authenticator
from mop.security.authorization import Authorizer
from mop.security.gatekeeper import Gatekeeper
from mop.security.identity import (
    AuthenticationError,
    AuthFailure,
    CertificateIdentity,
    Credentials,
    Principal,
)
from mop.security.passwords import PasswordFile, update_password_file
from mop.security.policy import SecurityPolicy
from mop.security.tokens import TokenVerifier, load_key_material
from mop.settings import AuthSettings, FlappingSettings, JwtSettings

NOW = 1_800_000_000.0
SECRET = "0123456789abcdef0123456789abcdef"
PASSWORDS = PasswordFile.parse(update_password_file("", "alice", b"wonderland"))
JWT = JwtSettings(secret=SECRET)
TOKENS = TokenVerifier(JWT, keys=load_key_material(JWT))


def token(sub: str = "alice", **claims: object) -> str:
    return jwt.encode({"sub": sub, "exp": NOW + 60, **claims}, SECRET, algorithm="HS256")


def chain(**kwargs: object) -> Authenticator:
    options: dict[str, object] = {
        "allow_anonymous": False,
        "order": ("password_file", "jwt", "certificate"),
        "passwords": PASSWORDS,
        "tokens": TOKENS,
        "acl_claim": "acl",
        "certificates": "cn",
    }
    options.update(kwargs)
    return Authenticator(**options)  # type: ignore[arg-type]


def refusal(authenticator: Authenticator, credentials: Credentials) -> AuthFailure:
    with pytest.raises(AuthenticationError) as caught:
        authenticator.authenticate(credentials, NOW)
    return caught.value.failure


def test_a_password_from_the_file_proves_its_user() -> None:
    principal = chain().authenticate(Credentials(username="alice", password=b"wonderland"), NOW)
    assert (principal.name, principal.method) == ("alice", "password_file")


def test_wrong_passwords_and_unknown_users_are_bad_credentials() -> None:
    assert (
        refusal(chain(), Credentials(username="alice", password=b"x"))
        is AuthFailure.BAD_CREDENTIALS
    )
    assert (
        refusal(chain(), Credentials(username="bob", password=b"x")) is AuthFailure.BAD_CREDENTIALS
    )
    # A user name alone proves nothing where credentials are checked.
    assert refusal(chain(), Credentials(username="alice")) is AuthFailure.BAD_CREDENTIALS


def test_a_token_is_taken_from_the_password_or_as_a_token() -> None:
    for credentials in (
        Credentials(username="whoever", password=token().encode()),
        Credentials(token=token()),
    ):
        principal = chain().authenticate(credentials, NOW)
        assert (principal.name, principal.method, principal.expires_at) == (
            "alice",
            "jwt",
            NOW + 60,
        )


def test_an_expired_token_is_told_apart() -> None:
    expired = jwt.encode({"sub": "alice", "exp": NOW - 10}, SECRET, algorithm="HS256")
    assert refusal(chain(), Credentials(token=expired)) is AuthFailure.EXPIRED


def test_a_token_acl_claim_is_carried_and_a_malformed_one_refused() -> None:
    principal = chain().authenticate(Credentials(token=token(acl={"pub": ["a/#"]})), NOW)
    assert principal.claim_acl is not None
    assert principal.claim_acl.decide("alice", "c", Access.WRITE, "a/b") is True
    assert refusal(chain(), Credentials(token=token(acl=42))) is AuthFailure.BAD_CREDENTIALS


def test_certificates_name_users_by_cn_or_san() -> None:
    certificate = CertificateIdentity("device-7", ("device-7.example.com",))
    assert chain().authenticate(Credentials(certificate=certificate), NOW).name == "device-7"
    by_san = chain(certificates="san").authenticate(Credentials(certificate=certificate), NOW)
    assert by_san.name == "device-7.example.com"


def test_the_order_decides_which_provider_answers_first() -> None:
    certificate = CertificateIdentity("device-7")
    both = Credentials(username="alice", password=b"wonderland", certificate=certificate)
    assert chain().authenticate(both, NOW).name == "alice"
    assert chain(order=("certificate", "password_file")).authenticate(both, NOW).name == "device-7"


def test_anonymous_clients_only_when_allowed() -> None:
    assert refusal(chain(), Credentials()) is AuthFailure.NOT_AUTHORIZED
    assert chain(allow_anonymous=True).authenticate(Credentials(), NOW).name is None
    # A wrong password is never taken for no password.
    wrong = Credentials(username="alice", password=b"x")
    assert refusal(chain(allow_anonymous=True), wrong) is AuthFailure.BAD_CREDENTIALS


def test_without_providers_credentials_prove_nothing() -> None:
    open_chain = Authenticator(allow_anonymous=True, order=("password_file", "jwt"))
    principal = open_chain.authenticate(Credentials(username="root", password=b"x"), NOW)
    assert principal.name is None  # anonymous: the claimed name gets no rights


def test_oversized_credentials_are_refused_unread() -> None:
    huge = Credentials(username="u" * 5000, password=b"x")
    assert refusal(chain(), huge) is AuthFailure.BAD_CREDENTIALS
    assert refusal(chain(), Credentials(token="a" * 100_000)) is AuthFailure.BAD_CREDENTIALS


def test_proxy_roles_are_marked() -> None:
    proxies = chain(proxy_roles=frozenset({"alice"}))
    principal = proxies.authenticate(Credentials(username="alice", password=b"wonderland"), NOW)
    assert principal.is_proxy


# -- authorization -------------------------------------------------------------------------------

RULES = AclRules.parse("user alice\ntopic readwrite a/#\ntopic deny a/secret\n")


def test_without_rules_everything_is_allowed() -> None:
    assert Authorizer(None).allows(Principal("x", "jwt"), "c", Access.WRITE, "any/topic")


def test_rules_deny_by_default() -> None:
    authorizer = Authorizer(RULES)
    alice = Principal("alice", "password_file")
    assert authorizer.allows(alice, "c", Access.WRITE, "a/b")
    assert not authorizer.allows(alice, "c", Access.WRITE, "a/secret")
    assert not authorizer.allows(alice, "c", Access.WRITE, "b")
    assert not authorizer.allows(Principal("bob", "jwt"), "c", Access.READ, "a/b")


def test_claims_come_before_the_file_and_proxies_pass() -> None:
    from mop.security.acl import ClaimAcl

    claim = ClaimAcl.from_claim([{"permission": "deny", "action": "all", "topic": "a/b"}])
    alice = Principal("alice", "jwt", claim_acl=claim)
    authorizer = Authorizer(RULES)
    assert not authorizer.allows(alice, "c", Access.WRITE, "a/b")
    assert authorizer.allows(alice, "c", Access.WRITE, "a/c")  # the file decides
    assert authorizer.allows(Principal("p", "jwt", is_proxy=True), "c", Access.WRITE, "x")


# -- the gatekeeper ------------------------------------------------------------------------------


def gatekeeper(settings: AuthSettings | None = None) -> Gatekeeper:
    policy = SecurityPolicy(chain(), Authorizer(RULES))
    return Gatekeeper(policy, settings or AuthSettings(max_failures=3))


def test_repeated_failures_block_the_address_even_for_the_right_password() -> None:
    keeper = gatekeeper()
    wrong = Credentials(client_id="c", address="10.0.0.1", username="alice", password=b"x")
    for _ in range(3):
        with pytest.raises(AuthenticationError):
            keeper.admit(wrong, NOW)
    right = Credentials(client_id="c", address="10.0.0.1", username="alice", password=b"wonderland")
    with pytest.raises(AuthenticationError) as caught:
        keeper.admit(right, NOW + 1)
    assert caught.value.failure is AuthFailure.BANNED
    other = Credentials(client_id="c", address="10.0.0.2", username="alice", password=b"wonderland")
    assert keeper.admit(other, NOW + 1).name == "alice"


def test_a_flapping_client_id_is_banned_and_the_ban_handed_on() -> None:
    keeper = gatekeeper(
        AuthSettings(flapping=FlappingSettings(enabled=True, max_count=3, window=10, ban_time=60))
    )
    stored = []
    keeper.on_ban = lambda ban: (stored.append(ban), keeper.bans.put(ban))
    credentials = Credentials(client_id="f", address="10.0.0.3", token=token())
    outcomes = []
    for second in range(5):
        try:
            keeper.admit(credentials, NOW + second)
            outcomes.append("ok")
        except AuthenticationError as exc:
            outcomes.append(exc.failure.value)
    assert outcomes[0] == "ok" and outcomes[-1] == "banned"
    assert [ban.kind for ban in stored] == ["clientid"]


def test_permissions_follow_a_new_policy() -> None:
    keeper = gatekeeper()
    alice = keeper.admit(Credentials(client_id="c", token=token()), NOW)
    permissions = keeper.permissions(alice, "c", "10.0.0.4")
    assert permissions.may(Access.WRITE, "a/b")
    assert not permissions.may(Access.WRITE, "z")
    keeper.replace(
        SecurityPolicy(chain(), Authorizer(AclRules.parse("user alice\ntopic write z\n")))
    )
    assert permissions.may(Access.WRITE, "z")
    assert not permissions.may(Access.WRITE, "a/b")
