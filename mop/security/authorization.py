"""Topic authorization: whether a principal may write, read or subscribe, and the per-client
cache that keeps the check off the per-message path.

Pure: the rules come in loaded; each client's `ClientPermissions` remembers its answers until
the rules change (a reload bumps the policy's generation).
"""

from __future__ import annotations

import logging
from typing import Protocol

from mop.log_limit import LimitedLog, RateLimit
from mop.security.acl import Access, AclRules
from mop.security.identity import Principal

log = logging.getLogger("mop.security")

# Answers a client remembers; past this it starts again (a client touching ever new topics).
_MAX_CACHED = 256
# Longer topics are checked each time rather than kept (bounds the memory per client).
_MAX_CACHED_TOPIC = 1024
# A client denied topic after topic (or a subscriber of many) must not fill the log: a line
# per kind of access per second at most, with the count of those held back.
_denials = LimitedLog(log, RateLimit(interval=1.0))


class Authorizer:
    """The ACL decision for one principal, client id, access and topic.

    Authorization is on once an ACL file is configured, or for a client whose token carries
    ACL rules: then whatever no rule allows is denied. The token's rules are asked first, then
    the file's; a deny rule of either wins over an allow of the same source. Proxies of the
    deployment (which authorize their own clients) and the node itself pass unchecked.
    """

    __slots__ = ("_rules",)

    def __init__(self, rules: AclRules | None) -> None:
        self._rules = rules

    @property
    def enabled(self) -> bool:
        return self._rules is not None

    def restricts(self, principal: Principal) -> bool:
        """Whether any rule applies to `principal` at all (else everything is allowed)."""
        if principal.superuser or principal.is_proxy:
            return False
        return self._rules is not None or principal.claim_acl is not None

    def allows(self, principal: Principal, client_id: str, access: Access, topic: str) -> bool:
        if not self.restricts(principal):
            return True
        if principal.claim_acl is not None:
            decided = principal.claim_acl.decide(principal.name, client_id, access, topic)
            if decided is not None:
                return decided
        if self._rules is not None:
            return self._rules.decide(principal.name, client_id, access, topic) is True
        return False


class RulesInForce(Protocol):
    """Where the authorizer in force is found; `generation` changes whenever it does."""

    @property
    def authorizer(self) -> Authorizer: ...

    @property
    def generation(self) -> int: ...


class ClientPermissions:
    """What one client may do, remembered per topic until the rules change.

    `rules` holds the authorizer in force and its generation; a new generation (a reload)
    forgets every remembered answer. Whether any rule applies to the client at all
    (`restricted`) is settled when it connects or re-authenticates: a reload reads the same
    files again, so it cannot turn an ACL on or off (and a client no rule restricts costs
    nothing per message). A denial is logged the first time it is decided, with
    the client id, user, address and topic, so a client retrying a denied topic does not fill
    the log (nor does one trying topic after topic: those lines are rate limited).
    """

    __slots__ = (
        "_address",
        "_cache",
        "_client_id",
        "_generation",
        "_generation_offset",
        "_rules",
        "principal",
        "restricted",
    )

    def __init__(
        self,
        rules: RulesInForce,
        principal: Principal,
        client_id: str,
        address: str,
    ) -> None:
        self._rules = rules
        self.principal = principal
        self._client_id = client_id
        self._address = address
        self._generation = -1
        self._generation_offset = 0
        self._cache: dict[tuple[Access, str], bool] | None = None
        self.restricted = rules.authorizer.restricts(principal)

    @property
    def generation(self) -> int:
        """The rules' generation, and the client's: it changes when answers given before may
        no longer hold (new rules, or the client re-authenticated)."""
        return self._rules.generation + self._generation_offset

    def become(self, principal: Principal) -> None:
        """The client re-authenticated (a fresh token): its answers are worked out anew."""
        self.principal = principal
        self.restricted = self._rules.authorizer.restricts(principal)
        self._cache = None
        self._generation_offset += 1 << 32

    def may(self, access: Access, topic: str) -> bool:
        if not self.restricted:
            return True
        rules = self._rules
        authorizer = rules.authorizer
        generation = rules.generation
        cache = self._cache
        if cache is None or generation != self._generation:
            cache = self._cache = {}
            self._generation = generation
        key = (access, topic)
        allowed = cache.get(key)
        if allowed is None:
            allowed = authorizer.allows(self.principal, self._client_id, access, topic)
            if len(topic) <= _MAX_CACHED_TOPIC:
                if len(cache) >= _MAX_CACHED:
                    cache.clear()
                cache[key] = allowed
            if not allowed:
                _denials.warning(
                    access.value,
                    "denied %s of %r to client %r (user %s, address %s)",
                    access.value,
                    topic[:200],
                    self._client_id,
                    self.principal.display,
                    self._address,
                )
        return allowed
