"""MQTT topic names <-> Pulsar topic names, the MoP way, and the Pulsar topic-name rules.

An MQTT name becomes the local name of a persistent topic, percent-encoded as Java's
`URLEncoder.encode(name, "UTF-8")` does, so mop and MoP brokers agree on every topic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_plus

from mop.topics import TOPIC_NAME_INVALID, TopicError

__all__ = [
    "FULL_NAME_SCHEMES",
    "SYSTEM_NAMESPACE",
    "PulsarTopicName",
    "is_exact_selector",
    "is_system_topic",
    "mqtt_to_pulsar",
    "namespace_of",
    "pulsar_to_mqtt",
    "system_topic",
    "table_topic",
]

# The namespace of each tenant where a deployment keeps its own state (tables, roles): its
# topics are compacted by mop brokers (the latest message of each key is kept).
SYSTEM_NAMESPACE: Final = "__mop"

# The prefixes of full Pulsar topic names (anything else is an MQTT name).
FULL_NAME_SCHEMES: Final = ("persistent://", "non-persistent://")
_DOMAINS = ("persistent", "non-persistent")

# URLEncoder keeps ASCII letters, digits and ".-*_", turns a space into "+" and every other
# byte of the UTF-8 encoding into "%XX" with uppercase hex. (urllib's quote_plus differs: it
# keeps "~" and escapes "*".)
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-*_")
_BYTE_ESCAPES = tuple(
    chr(byte) if byte in _UNRESERVED else "+" if byte == 0x20 else f"%{byte:02X}"
    for byte in range(256)
)
# For ASCII names (nearly all of them) str.translate does the same in one C-level pass.
_ASCII_ESCAPES = {byte: _BYTE_ESCAPES[byte] for byte in range(128)}

# Pulsar's rule for tenant and namespace names.
_NAMED_ENTITY = re.compile(r"[-=:.\w]+", re.ASCII)


def _encode(name: str) -> str:
    if name.isascii():
        return name.translate(_ASCII_ESCAPES)
    try:
        data = name.encode("utf-8")
    except UnicodeEncodeError:
        raise TopicError(
            TOPIC_NAME_INVALID, f"topic name {name!r:.80} is not valid UTF-8"
        ) from None
    return "".join([_BYTE_ESCAPES[byte] for byte in data])


def is_exact_selector(selector: str) -> bool:
    """Whether a subscription selector names one topic (it is no MQTT filter with wildcards).
    A full Pulsar name is always exact: its "+" is an encoded space, never a wildcard."""
    if selector.startswith(FULL_NAME_SCHEMES):
        return True
    return "+" not in selector and "#" not in selector


def mqtt_to_pulsar(mqtt_topic: str, *, tenant: str = "public", namespace: str = "default") -> str:
    """The Pulsar topic for an MQTT topic name: `a/b` -> `persistent://public/default/a%2Fb`.

    A name that already starts with `persistent://` or `non-persistent://` is used as given.
    Raises `TopicError` (0x90) for a string that has no UTF-8 encoding (a lone surrogate).
    """
    if mqtt_topic.startswith(FULL_NAME_SCHEMES):
        return mqtt_topic
    return f"persistent://{tenant}/{namespace}/{_encode(mqtt_topic)}"


def system_topic(tenant: str, namespace: str, kind: str, name: str) -> str:
    """`persistent://{tenant}/__mop/{namespace}/{kind}/{name}`, the last part percent-encoded
    (a space as %20, since brokers refuse "+" in topic names)."""
    local = f"{namespace}/{kind}/{name}"
    return mqtt_to_pulsar(local, tenant=tenant, namespace=SYSTEM_NAMESPACE).replace("+", "%20")


def is_system_topic(topic: str, tenant: str) -> bool:
    """Whether `topic` (a full name, or a filter spelt as one) is in `tenant`'s system
    namespace, which holds the deployment's own topics (its tables): no client's business."""
    return topic.startswith(
        tuple(f"{scheme}{tenant}/{SYSTEM_NAMESPACE}/" for scheme in FULL_NAME_SCHEMES)
    )


def table_topic(tenant: str, namespace: str, name: str) -> str:
    """The compacted topic that holds table `name` of a deployment's default `namespace`: each
    message sets its key to its payload, or deletes it (see `mop.message.TOMBSTONE_PROPERTY`).
    A separated proxy reads it into memory; a merged node's table is this topic of its broker."""
    return system_topic(tenant, namespace, "table", name)


def pulsar_to_mqtt(pulsar_topic: str, *, tenant: str = "public", namespace: str = "default") -> str:
    """The MQTT topic name under which MQTT clients see the fully qualified `pulsar_topic`.

    A persistent topic of the given tenant and namespace whose local name `mqtt_to_pulsar`
    could have produced is decoded; any other name is returned unchanged, which maps back to
    itself. So `mqtt_to_pulsar(pulsar_to_mqtt(p)) == p` for every fully qualified name.
    """
    prefix = f"persistent://{tenant}/{namespace}/"
    if not pulsar_topic.startswith(prefix):
        return pulsar_topic
    try:
        mqtt_topic = unquote_plus(pulsar_topic[len(prefix) :], errors="strict")
    except UnicodeDecodeError:
        return pulsar_topic
    # Decoding is lenient (lowercase hex, a stray "%", "~", a decoded name that itself starts
    # with a scheme), so only accept a result that encodes back to the very same topic;
    # otherwise two Pulsar topics would show up under one MQTT name.
    if mqtt_to_pulsar(mqtt_topic, tenant=tenant, namespace=namespace) != pulsar_topic:
        return pulsar_topic
    # A Pulsar client may name a topic that MQTT cannot publish to (e.g. "a%2B" is "a+"); the
    # full Pulsar name is the better MQTT name then.
    if not mqtt_topic or "+" in mqtt_topic or "#" in mqtt_topic or "\x00" in mqtt_topic:
        return pulsar_topic
    return mqtt_topic


@dataclass(frozen=True, slots=True)
class PulsarTopicName:
    """A fully qualified Pulsar topic name: `{domain}://{tenant}/{namespace}/{local_name}`.

    Construction checks the parts and raises `TopicError` (0x90) when one is invalid.
    """

    domain: str
    tenant: str
    namespace: str
    local_name: str

    def __post_init__(self) -> None:
        if self.domain not in _DOMAINS:
            self._fail(f"domain {self.domain!r} is neither 'persistent' nor 'non-persistent'")
        if not _NAMED_ENTITY.fullmatch(self.tenant):
            self._fail(f"tenant {self.tenant!r} must be non-empty and use only [-=:.A-Za-z0-9_]")
        if not _NAMED_ENTITY.fullmatch(self.namespace):
            self._fail(
                f"namespace {self.namespace!r} must be non-empty and use only [-=:.A-Za-z0-9_]"
            )
        if not self.local_name:
            self._fail("the local topic name is empty")
        if "/" in self.local_name:
            # Pulsar would read a fourth part as the legacy tenant/cluster/namespace/topic form.
            self._fail(f"the local topic name {self.local_name!r} contains '/'")

    def _fail(self, reason: str) -> None:
        raise TopicError(TOPIC_NAME_INVALID, f"invalid Pulsar topic name {str(self)!r}: {reason}")

    @classmethod
    def parse(cls, name: str) -> PulsarTopicName:
        """Parse a full name or a short form Pulsar clients accept.

        `my-topic` means `persistent://public/default/my-topic` and `tenant/ns/topic` means
        `persistent://tenant/ns/topic`. The legacy four-part form (with a cluster) is refused.
        """
        if not name:
            raise TopicError(TOPIC_NAME_INVALID, "Pulsar topic name is empty")
        domain, sep, rest = name.partition("://")
        if not sep:
            parts = name.split("/")
            if len(parts) == 1:
                return cls("persistent", "public", "default", name)
            if len(parts) == 3:
                return cls("persistent", parts[0], parts[1], parts[2])
            raise TopicError(
                TOPIC_NAME_INVALID,
                f"invalid Pulsar topic name {name!r}: a short name is <topic> or"
                " <tenant>/<namespace>/<topic>",
            )
        parts = rest.split("/", 2)
        if len(parts) != 3:
            raise TopicError(
                TOPIC_NAME_INVALID,
                f"invalid Pulsar topic name {name!r}: expected"
                f" {domain}://<tenant>/<namespace>/<topic>",
            )
        return cls(domain, parts[0], parts[1], parts[2])

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"


def namespace_of(topic: str) -> str:
    """ "tenant/namespace" of a full topic name ("persistent://tenant/namespace/local")."""
    _, _, rest = topic.partition("://")
    tenant, _, rest = rest.partition("/")
    namespace, _, _ = rest.partition("/")
    return f"{tenant}/{namespace}"
