"""Selectors -> the topic patterns of pulsar-client pattern consumers, and back to matching.

A pulsar-client pattern consumer follows every topic of one namespace whose name without its
domain (`tenant/namespace/local`) the whole pattern matches (`regex_match`, ECMAScript flavour);
it polls the namespace's topic list to find topics created later. MQTT filters are turned into
such patterns over the percent-encoded local names `mop.topic_names` gives MQTT topics. The
patterns use only what ECMAScript, Java and Python regexes read alike: literals, escapes of
punctuation, bracket classes, `(?:...)`, `|`, `*` and `?`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from mop.topic_names import PulsarTopicName, is_exact_selector, mqtt_to_pulsar, pulsar_to_mqtt
from mop.topics import TopicError, matches

__all__ = ["SelectorPlan", "UnsupportedSelector", "filter_pattern", "matching_selectors", "plan"]

# The local name of an MQTT topic holds ASCII letters, digits and ".-*_+" as themselves and
# every other byte as "%XX" (uppercase hex); "%2F" is the level separator "/".
_SEPARATOR = "%2F"
# One character of a level: anything but the separator.
_LEVEL_CHAR = "(?:[^%]|%[013-9A-F][0-9A-F]|%2[0-9A-E])"
# The first character of a level that must not start with "$" (%24) nor end at once.
_NOT_DOLLAR = "(?:[^%]|%[013-9A-F][0-9A-F]|%2[0-35-9A-E])"
# The first character of a topic matched by "#": anything but "$" (an empty level is fine).
_NOT_DOLLAR_OR_SEPARATOR = "(?:[^%]|%[013-9A-F][0-9A-F]|%2[0-35-9A-F])"
# Regex punctuation; escaping it with a backslash means the character in every flavour. (A
# local name has no "/", and the client splits patterns at "/" to find the namespace.)
_SPECIAL = re.compile(r"([.*+?^${}()|\[\]\\])")


class UnsupportedSelector(ValueError):
    """A selector separated mode cannot follow (e.g. a non-persistent topic)."""


def _literal(text: str) -> str:
    return _SPECIAL.sub(r"\\\1", text)


def _encoded(level: str, tenant: str, namespace: str) -> str:
    # The encoding of one level, taken from the full topic name so that it is exactly the one
    # topics get (the encoding works byte by byte, so levels encode independently).
    return mqtt_to_pulsar(level, tenant=tenant, namespace=namespace).rpartition("/")[2]


def filter_pattern(topic_filter: str, *, tenant: str = "public", namespace: str = "default") -> str:
    """A pattern for the local names of the topics an MQTT filter matches.

    `a/+/c` -> `a%2F(?:...)*%2Fc`; `a/#` also matches `a` itself; a wildcard in the first
    level never matches a topic that starts with `$`, as in MQTT.
    """
    parts: list[str] = []
    for index, level in enumerate(topic_filter.split("/")):
        first = index == 0
        if level == "#":
            parts.append(f"(?:{_NOT_DOLLAR_OR_SEPARATOR}.*)?" if first else f"(?:{_SEPARATOR}.*)?")
            break
        if not first:
            parts.append(_SEPARATOR)
        if level == "+":
            parts.append(f"(?:{_NOT_DOLLAR}{_LEVEL_CHAR}*)?" if first else f"{_LEVEL_CHAR}*")
        elif level:
            parts.append(_literal(_encoded(level, tenant, namespace)))
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class SelectorPlan:
    """How a consumer follows its selectors: one plain consumer of `single` (a lone exact
    selector), else one pattern consumer per namespace (`patterns`: namespace -> pattern)."""

    single: str | None = None
    patterns: dict[str, str] = field(default_factory=dict)


def plan(
    selectors: Iterable[str], *, tenant: str = "public", namespace: str = "default"
) -> SelectorPlan:
    """The consumers that cover `selectors`; raises UnsupportedSelector for one that cannot be
    followed with persistent-topic patterns."""
    selectors = sorted(set(selectors))
    if not selectors:
        raise UnsupportedSelector("a consumer needs at least one selector")
    alternatives: dict[str, list[str]] = {}
    for selector in selectors:
        if is_exact_selector(selector):
            name = _topic(selector, tenant, namespace)
            key = f"{name.tenant}/{name.namespace}"
            alternatives.setdefault(key, []).append(_literal(name.local_name))
        else:
            key = f"{tenant}/{namespace}"
            pattern = filter_pattern(selector, tenant=tenant, namespace=namespace)
            alternatives.setdefault(key, []).append(pattern)
    if len(selectors) == 1 and is_exact_selector(selectors[0]):
        return SelectorPlan(single=str(_topic(selectors[0], tenant, namespace)))
    return SelectorPlan(
        patterns={
            key: f"{key}/(?:{'|'.join(sorted(set(parts)))})"
            for key, parts in sorted(alternatives.items())
        }
    )


def _topic(selector: str, tenant: str, namespace: str) -> PulsarTopicName:
    try:
        name = PulsarTopicName.parse(mqtt_to_pulsar(selector, tenant=tenant, namespace=namespace))
    except TopicError as exc:
        raise UnsupportedSelector(f"selector {selector!r}: {exc}") from None
    if name.domain != "persistent":
        raise UnsupportedSelector(
            f"selector {selector!r}: only persistent topics can be followed in separated mode"
        )
    return name


def matching_selectors(
    topic: str, selectors: Iterable[str], *, tenant: str = "public", namespace: str = "default"
) -> list[str]:
    """The selectors that match `topic` (a full Pulsar name), with the rules of merged mode:
    an exact selector names its topic in MQTT or Pulsar form, a filter matches the MQTT name."""
    mqtt = pulsar_to_mqtt(topic, tenant=tenant, namespace=namespace)
    found = []
    for selector in selectors:
        if is_exact_selector(selector):
            if mqtt_to_pulsar(selector, tenant=tenant, namespace=namespace) == topic:
                found.append(selector)
        elif matches(selector, mqtt):
            found.append(selector)
    return found
