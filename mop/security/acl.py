"""Topic access rules: mosquitto's ACL file and the ACL claim of EMQX's JSON Web Tokens.

Pure logic: the caller reads the file or verifies the token and hands over the text or the
decoded claim; `decide` answers allowed, denied, or "no rule speaks of it" for one access.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from mop.topics import SubscriptionTrie, TopicError, matches, validate_topic_filter

__all__ = ["MAX_CLAIM_RULES", "Access", "AclError", "AclRules", "ClaimAcl", "covers"]

# A claim arrives in a token that anyone holding a signing key can shape: bound the work.
MAX_CLAIM_RULES = 1000
_SHARE_PREFIX = "$share/"
_MAX_SHOWN = 60


class Access(enum.Enum):
    """What a client wants to do with a topic."""

    # Publish to a topic name (MQTT PUBLISH, a Pulsar producer).
    WRITE = "write"
    # Be sent a message of a topic name (delivery to a subscription, a Pulsar consumer or reader).
    READ = "read"
    # Hold a subscription to a topic filter (the inner filter of `$share/{group}/{filter}`).
    SUBSCRIBE = "subscribe"


class AclError(ValueError):
    """Rules that cannot be used; the message is one line saying where and what is wrong."""


def _show(value: object) -> str:
    # Only text is shown, cut short: the repr of a hostile claim's nested lists could be huge.
    if not isinstance(value, str):
        return type(value).__name__
    return repr(value) if len(value) <= _MAX_SHOWN else repr(value[:_MAX_SHOWN]) + "..."


def covers(rule_filter: str, sub_filter: str) -> bool:
    """Whether every topic name that `sub_filter` matches is also matched by `rule_filter`.

    Both are valid MQTT filters without `$share/`. `a/#` covers `a/+/c`, `a/#` and `a`; `a/+`
    does not cover `a/#`; `#` covers `a/#` but not `$SYS/#`, as a wildcard at the first level
    never matches a topic that starts with `$`.
    """
    rule = rule_filter.split("/")
    sub = sub_filter.split("/")
    for index, level in enumerate(rule):
        if level == "#":
            # Everything below is covered, except `$` topics when the rule is `#` itself; a
            # subscription can only reach those by naming `$...` at its first level.
            return index > 0 or not sub[0].startswith("$")
        if index == len(sub):
            # The rule asks for more levels than the subscription's topics have.
            return False
        wanted = sub[index]
        if wanted == "#":
            # The subscription reaches any depth, and its parent too, which a rule with '+'
            # here misses; unless the parent is no topic name: `#` has none and the parent of
            # `/#` would be the empty name, so `+/#` covers `#` and `/+/#` covers `/#`.
            no_parent = index == 0 or (index == 1 and sub[0] == "")
            return no_parent and level == "+" and rule[index + 1 :] == ["#"]
        if level == "+":
            if index == 0 and wanted.startswith("$"):
                return False
        elif level != wanted:
            return False
    return len(rule) == len(sub)


def _reaches(rule_filter: str, access: Access, topic: str) -> bool:
    """Whether a rule's filter speaks of `topic`: a filter to subscribe to, else a name."""
    if access is Access.SUBSCRIBE:
        return covers(rule_filter, topic)
    return matches(rule_filter, topic)


def _check_filter(topic_filter: str, where: str) -> None:
    if topic_filter.startswith(_SHARE_PREFIX):
        # Callers ask about the filter a shared subscription shares, never about the group.
        raise AclError(
            f"{where}: {_show(topic_filter)} is a shared subscription; name the filter it shares"
        )
    try:
        validate_topic_filter(topic_filter)
    except TopicError as error:
        raise AclError(f"{where}: {error}") from None


class _Slot(enum.Enum):
    """A placeholder in a rule's topic, filled in for each client."""

    USERNAME = "username"
    CLIENT_ID = "client id"


@dataclass(frozen=True, slots=True)
class _Template:
    """A rule's topic filter split at its placeholders; `static` is set when it has none."""

    parts: tuple[str | _Slot, ...]
    static: str | None

    def fill(self, username: str | None, client_id: str) -> str | None:
        """The filter for this client, or None when the rule cannot apply to it: it names the
        username of an anonymous client, or a value holding '+' or '#', which would act as
        wildcards and reach other clients' topics."""
        if self.static is not None:
            return self.static
        pieces: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                pieces.append(part)
                continue
            value = username if part is _Slot.USERNAME else client_id
            if value is None or "+" in value or "#" in value:
                return None
            pieces.append(value)
        return "".join(pieces)


_SLOTS = {
    "%u": _Slot.USERNAME,
    "%c": _Slot.CLIENT_ID,
    "${username}": _Slot.USERNAME,
    "${clientid}": _Slot.CLIENT_ID,
}
# How each format writes placeholders: mosquitto `%u`, EMQX 5 `${username}`. EMQX 4 wrote `%u`
# in the object format that EMQX 5 still reads with `${...}`, so that format takes both.
_FILE_PLACEHOLDERS = re.compile(r"%[uc]")
_CLAIM_PLACEHOLDERS = re.compile(r"\$\{[^}]*\}")
_OBJECT_PLACEHOLDERS = re.compile(r"\$\{[^}]*\}|%[uc]")


def _template(text: str, placeholders: re.Pattern[str], where: str) -> _Template:
    parts: list[str | _Slot] = []
    start = 0
    for found in placeholders.finditer(text):
        slot = _SLOTS.get(found.group())
        if slot is None:
            # Left as text it would never match, and a deny rule that never matches allows.
            raise AclError(
                f"{where}: unsupported placeholder {_show(found.group())} "
                "(${username}, ${clientid})"
            )
        if found.start() > start:
            parts.append(text[start : found.start()])
        parts.append(slot)
        start = found.end()
    if start < len(text):
        parts.append(text[start:])
    static = text if all(isinstance(part, str) for part in parts) else None
    return _Template(tuple(parts), static)


# --- the ACL file ------------------------------------------------------------------------------


class _Grant(enum.Enum):
    """The access word of a `topic` or `pattern` line."""

    READ = "read"
    WRITE = "write"
    READWRITE = "readwrite"
    DENY = "deny"


# What each grant allows; a deny rule takes all three away.
_GRANTED: dict[_Grant, frozenset[Access]] = {
    _Grant.READ: frozenset({Access.READ, Access.SUBSCRIBE}),
    _Grant.WRITE: frozenset({Access.WRITE}),
    _Grant.READWRITE: frozenset(Access),
    _Grant.DENY: frozenset(Access),
}
_GRANT_WORDS = {grant.value: grant for grant in _Grant}


@dataclass(frozen=True, slots=True)
class _FileRule:
    """One `topic` or `pattern` line; `user` is None for the anonymous block and patterns."""

    user: str | None
    pattern: bool
    grant: _Grant
    topic: str


class _RuleSet:
    """The `topic` rules of one user, or of anonymous clients, ready for per-message checks.

    Topic names are looked up in a trie, so the cost of READ and WRITE checks does not grow
    with the number of rules; SUBSCRIBE, rarer, compares the filter with each rule.
    """

    __slots__ = ("_rules", "_trie")

    def __init__(self, rules: list[tuple[str, _Grant]]) -> None:
        self._rules = tuple(rules)
        self._trie: SubscriptionTrie[_Grant, None] = SubscriptionTrie()
        for topic_filter, grant in rules:
            self._trie.add(topic_filter, grant, None)

    def decide(self, access: Access, topic: str) -> bool | None:
        if access is Access.SUBSCRIBE:
            grants = [grant for rule, grant in self._rules if covers(rule, topic)]
        else:
            grants = [grant for _, grant, _ in self._trie.match(topic)]
        verdict: bool | None = None
        for grant in grants:
            if grant is _Grant.DENY:
                return False
            if access in _GRANTED[grant]:
                verdict = True
        return verdict


@dataclass(frozen=True, slots=True)
class _Pattern:
    grant: _Grant
    template: _Template


@dataclass(frozen=True, slots=True)
class AclRules:
    """The rules of a mosquitto ACL file (`acl_file`), which users bring along unchanged.

    `topic` lines before the first `user` line are for anonymous clients only; those after
    `user NAME` are for that user. `pattern` lines are for every client, wherever they stand,
    with `%u` and `%c` replaced by the client's username and client id. A deny rule that
    speaks of the access wins over any grant; without either, no rule of the file decides.
    """

    _rules: tuple[_FileRule, ...]
    _anonymous: _RuleSet = field(compare=False, repr=False)
    _users: Mapping[str, _RuleSet] = field(compare=False, repr=False)
    # Per access, the patterns that can speak of it, deny rules first.
    _patterns: Mapping[Access, tuple[_Pattern, ...]] = field(compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> AclRules:
        """Read the text of an ACL file; raises `AclError` naming the first bad line."""
        rules: list[_FileRule] = []
        user: str | None = None
        # Lines are split on '\n' alone so that line numbers agree with the user's editor.
        for number, line in enumerate(text.split("\n"), start=1):
            words = line.split(maxsplit=1)
            if not words or words[0].startswith("#"):
                continue
            where = f"line {number}"
            keyword = words[0]
            rest = words[1].rstrip() if len(words) == 2 else ""
            if keyword == "user":
                if not rest:
                    raise AclError(f"{where}: 'user' needs a username")
                user = rest
            elif keyword in ("topic", "pattern"):
                grant, topic = _grant_and_topic(keyword, rest, where)
                _check_filter(topic, where)
                pattern = keyword == "pattern"
                rules.append(_FileRule(None if pattern else user, pattern, grant, topic))
            else:
                raise AclError(f"{where}: unknown keyword {_show(keyword)} (user, topic, pattern)")
        return cls._index(tuple(rules))

    @classmethod
    def _index(cls, rules: tuple[_FileRule, ...]) -> AclRules:
        anonymous: list[tuple[str, _Grant]] = []
        users: dict[str, list[tuple[str, _Grant]]] = {}
        patterns: list[_Pattern] = []
        for rule in rules:
            if rule.pattern:
                patterns.append(_Pattern(rule.grant, _template(rule.topic, _FILE_PLACEHOLDERS, "")))
            elif rule.user is None:
                anonymous.append((rule.topic, rule.grant))
            else:
                users.setdefault(rule.user, []).append((rule.topic, rule.grant))
        by_access = {
            access: tuple(
                sorted(
                    (pattern for pattern in patterns if access in _GRANTED[pattern.grant]),
                    key=lambda pattern: pattern.grant is not _Grant.DENY,
                )
            )
            for access in Access
        }
        return cls(
            rules,
            _RuleSet(anonymous),
            {name: _RuleSet(user_rules) for name, user_rules in users.items()},
            by_access,
        )

    @property
    def rule_count(self) -> int:
        """How many `topic` and `pattern` lines the file has."""
        return len(self._rules)

    def decide(
        self, username: str | None, client_id: str, access: Access, topic: str
    ) -> bool | None:
        """True if a rule allows the access, False if a deny rule forbids it, None if no rule
        of the file speaks of it. `topic` is a topic name, or a filter for SUBSCRIBE."""
        rules = self._anonymous if username is None else self._users.get(username)
        verdict = None if rules is None else rules.decide(access, topic)
        if verdict is False:
            return False
        for pattern in self._patterns[access]:
            if verdict and pattern.grant is not _Grant.DENY:
                # Deny patterns come first: once they are past, nothing can take it away.
                break
            rule_filter = pattern.template.fill(username, client_id)
            if rule_filter is not None and _reaches(rule_filter, access, topic):
                return pattern.grant is not _Grant.DENY
        return verdict


def _grant_and_topic(keyword: str, rest: str, where: str) -> tuple[_Grant, str]:
    """Split `[access] topic`. As in mosquitto, the access word may be left out (readwrite)
    only when the topic has no spaces: otherwise the first word must be an access word."""
    words = rest.split(maxsplit=1)
    if not words:
        raise AclError(f"{where}: {keyword!r} needs a topic")
    if len(words) == 1:
        if words[0] in _GRANT_WORDS:
            raise AclError(f"{where}: {keyword!r} needs a topic after {words[0]!r}")
        return _Grant.READWRITE, words[0]
    grant = _GRANT_WORDS.get(words[0])
    if grant is None:
        raise AclError(
            f"{where}: unknown access {_show(words[0])} (read, write, readwrite, deny; "
            "a topic with spaces needs one)"
        )
    return grant, words[1]


# --- the ACL claim of a token ------------------------------------------------------------------

_ALL = frozenset(Access)
# Subscribing also means being sent the messages of the topics the filter matches.
_SUBSCRIBING = frozenset({Access.SUBSCRIBE, Access.READ})
_PUBLISHING = frozenset({Access.WRITE})
_OBJECT_KEYS = {"pub": _PUBLISHING, "sub": _SUBSCRIBING, "all": _ALL}
_ACTIONS = {"publish": _PUBLISHING, "subscribe": _SUBSCRIBING, **_OBJECT_KEYS}
# `qos` and `retain` narrow a rule in EMQX; they are accepted and not enforced. Any other field
# (EMQX 5.9's `ipaddr`, `clientid_re`...) narrows an allow rule too: ignoring one would widen
# the grant, so a claim carrying one is refused instead.
_RULE_FIELDS = frozenset({"permission", "action", "topic", "topics", "qos", "retain"})
_EXACT_PREFIX = "eq "


@dataclass(frozen=True, slots=True)
class _ClaimRule:
    allow: bool
    accesses: frozenset[Access]
    template: _Template
    # `eq FILTER`: the topic or subscription filter must be this text, wildcards and all.
    exact: bool

    def reaches(self, username: str | None, client_id: str, access: Access, topic: str) -> bool:
        rule_filter = self.template.fill(username, client_id)
        if rule_filter is None:
            return False
        if not self.exact:
            return _reaches(rule_filter, access, topic)
        if access is Access.READ:
            # Being sent the messages of a subscription the rule allowed: the topics its filter
            # matches. (A deny of one literal filter keeps nothing else from being delivered.)
            return self.allow and matches(rule_filter, topic)
        return rule_filter == topic


@dataclass(frozen=True, slots=True)
class ClaimAcl:
    """ACL rules carried by a token, in either of EMQX's formats.

    The list format (EMQX 5.5+), `[{"permission": "allow", "action": "publish", "topic":
    "t/${clientid}"}, ...]`, is read in order and the first rule that speaks of the access
    decides. The object format (EMQX 4, older EMQX 5), `{"pub": [...], "sub": [...], "all":
    [...]}`, lists grants only and, as in EMQX, is closed: what it does not grant is denied,
    without asking the ACL file. `subscribe` grants both holding a subscription and being
    sent its messages; a topic written `eq FILTER` is compared as text, without wildcards.
    """

    _rules: tuple[_ClaimRule, ...]
    # The object format: no matching grant denies (instead of leaving it to the ACL file).
    _closed: bool = False

    @classmethod
    def from_claim(cls, value: object) -> ClaimAcl:
        """Read a decoded claim; raises `AclError` when it has the wrong shape."""
        if isinstance(value, list):
            return cls(_list_claim(value))
        if isinstance(value, dict):
            return cls(_object_claim(value), _closed=True)
        raise AclError(
            "acl claim must be a list of rules or an object of pub/sub/all lists, "
            f"not {type(value).__name__}"
        )

    @property
    def rule_count(self) -> int:
        """How many rules the claim has, one per topic."""
        return len(self._rules)

    def decide(
        self, username: str | None, client_id: str, access: Access, topic: str
    ) -> bool | None:
        """True or False as the first rule that speaks of the access says; when none does,
        False for a closed (object format) claim, else None. `topic` is a topic name, or a
        filter for SUBSCRIBE."""
        for rule in self._rules:
            if access not in rule.accesses:
                continue
            if rule.reaches(username, client_id, access, topic):
                return rule.allow
        return False if self._closed else None


def _add_rules(
    rules: list[_ClaimRule],
    topics: object,
    allow: bool,
    accesses: frozenset[Access],
    placeholders: re.Pattern[str],
    where: str,
) -> None:
    """Append a rule for each topic of `topics`, a list of the claim."""
    if not isinstance(topics, list):
        raise AclError(f"{where}: topics come in a list, not {_show(topics)}")
    if len(rules) + len(topics) > MAX_CLAIM_RULES:
        raise AclError(f"acl claim: more than {MAX_CLAIM_RULES} rules")
    for topic in topics:
        if not isinstance(topic, str):
            raise AclError(f"{where}: a topic is a string, not {_show(topic)}")
        exact = topic.startswith(_EXACT_PREFIX)
        text = topic[len(_EXACT_PREFIX) :] if exact else topic
        _check_filter(text, where)
        template = _Template((text,), text) if exact else _template(text, placeholders, where)
        rules.append(_ClaimRule(allow, accesses, template, exact))


def _list_claim(claim: list[object]) -> tuple[_ClaimRule, ...]:
    if len(claim) > MAX_CLAIM_RULES:
        raise AclError(f"acl claim: more than {MAX_CLAIM_RULES} rules")
    rules: list[_ClaimRule] = []
    for number, item in enumerate(claim, start=1):
        where = f"acl claim rule {number}"
        if not isinstance(item, dict):
            raise AclError(f"{where}: a rule is an object, not {_show(item)}")
        unknown = [key for key in item if key not in _RULE_FIELDS]
        if unknown:
            raise AclError(f"{where}: unsupported field {_show(unknown[0])}")
        permission = item.get("permission")
        if permission not in ("allow", "deny"):
            raise AclError(f"{where}: unknown permission {_show(permission)} (allow, deny)")
        action = item.get("action")
        accesses = _ACTIONS.get(action) if isinstance(action, str) else None
        if accesses is None:
            raise AclError(f"{where}: unknown action {_show(action)} ({', '.join(_ACTIONS)})")
        if ("topic" in item) == ("topics" in item):
            raise AclError(f"{where}: a rule has either 'topic' or 'topics'")
        topics = [item["topic"]] if "topic" in item else item["topics"]
        allow = permission == "allow"
        _add_rules(rules, topics, allow, accesses, _CLAIM_PLACEHOLDERS, where)
    return tuple(rules)


def _object_claim(claim: dict[object, object]) -> tuple[_ClaimRule, ...]:
    rules: list[_ClaimRule] = []
    for key, topics in claim.items():
        accesses = _OBJECT_KEYS.get(key) if isinstance(key, str) else None
        if accesses is None:
            raise AclError(f"acl claim: unknown key {_show(key)} (pub, sub, all)")
        _add_rules(rules, topics, True, accesses, _OBJECT_PLACEHOLDERS, f"acl claim {key!r}")
    return tuple(rules)
