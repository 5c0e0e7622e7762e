"""Selectors -> what a separated-mode consumer follows, and topics -> the selectors they match.

A consumer subscribes to every topic it follows with a plain consumer: the topic
of each exact selector, and the topics of the namespace that an MQTT filter matches, found by
the proxy's one topic poller per namespace (`discovery`). Topics whose first MQTT level
is `$SYS` are node-local: each proxy serves its own (`mop.backends.node_local`), none goes to the
brokers. Matching follows the rules of merged mode (`mop.topics.matches` on the MQTT name).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mop.backends.node_local import LOCAL_ROOT, is_local
from mop.processor.backend import BackendError
from mop.topic_names import PulsarTopicName, is_exact_selector, mqtt_to_pulsar, pulsar_to_mqtt
from mop.topics import TopicError, matches

__all__ = [
    "LOCAL_ROOT",
    "SelectorPlan",
    "UnsupportedSelector",
    "is_local",
    "matching_selectors",
    "plan",
]


class UnsupportedSelector(BackendError):
    """A selector separated mode cannot follow (e.g. a non-persistent topic)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="not_supported")


@dataclass(frozen=True, slots=True)
class SelectorPlan:
    """How a consumer follows its selectors: a plain consumer for each topic in `exact` (full
    Pulsar names), the topics the poller finds for the MQTT `filters` (of the backend's
    namespace), and the node's own topics for the selectors in `local`."""

    exact: frozenset[str] = frozenset()
    filters: frozenset[str] = frozenset()
    local: frozenset[str] = frozenset()


def plan(
    selectors: Iterable[str], *, tenant: str = "public", namespace: str = "default"
) -> SelectorPlan:
    """The plan that covers `selectors`; raises UnsupportedSelector for one that cannot be
    followed (a non-persistent or invalid topic) and for no selector at all."""
    exact: set[str] = set()
    filters: set[str] = set()
    local: set[str] = set()
    for selector in set(selectors):
        if selector.startswith(("persistent://", "non-persistent://")):
            name = _topic(selector, tenant, namespace)
            mqtt = pulsar_to_mqtt(str(name), tenant=tenant, namespace=namespace)
            if is_local(mqtt):
                local.add(mqtt)
            else:
                exact.add(str(name))
        elif is_local(selector):
            local.add(selector)
        elif is_exact_selector(selector):
            exact.add(str(_topic(selector, tenant, namespace)))
        else:
            filters.add(selector)
    if not (exact or filters or local):
        raise UnsupportedSelector("a consumer needs at least one selector")
    return SelectorPlan(frozenset(exact), frozenset(filters), frozenset(local))


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
