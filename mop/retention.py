"""Retention policies as Pulsar defines them: per namespace, how long (time) and how much (size,
per topic) of a topic's history stays stored once no subscription owes it any more. Pure: the
broker applies them, the admin API changes them, settings give their defaults.

A message that some subscription has not acknowledged (its backlog) is never touched by
retention. Once every subscription acknowledged it, or on a topic without subscriptions, it
stays until either limit is exceeded: it is older than `time_seconds`, or the topic's stored
messages (backlog included, as Pulsar counts) exceed `size_bytes`. -1 means no limit, 0 keeps
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from mop.topic_names import SYSTEM_NAMESPACE, namespace_of

__all__ = [
    "INFINITE",
    "NO_RETENTION",
    "RetentionControl",
    "RetentionPolicies",
    "RetentionPolicy",
]

# A limit that never trims.
INFINITE: Final = -1


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Seconds and bytes (per topic) of acknowledged history to keep; -1: unlimited, 0: none."""

    time_seconds: int
    size_bytes: int

    def __post_init__(self) -> None:
        if self.time_seconds < INFINITE or self.size_bytes < INFINITE:
            raise ValueError("retention limits must be -1 (unlimited), 0 (none) or positive")

    @property
    def keeps_nothing(self) -> bool:
        return self.time_seconds == 0 or self.size_bytes == 0

    @property
    def keeps_everything(self) -> bool:
        return self.time_seconds == INFINITE and self.size_bytes == INFINITE

    def to_json(self) -> bytes:
        return json.dumps(
            {"time_seconds": self.time_seconds, "size_bytes": self.size_bytes}
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> RetentionPolicy:
        document = json.loads(raw)
        return cls(int(document["time_seconds"]), int(document["size_bytes"]))


# What a topic of the system namespace keeps: its tables hold the state, its log is only the
# way changes travel, so acknowledged changes go at once (as before retention existed).
NO_RETENTION: Final = RetentionPolicy(0, 0)


class RetentionPolicies:
    """The policy of each namespace: a run-time override (admin API) if there is one, else the
    namespace's entry in settings, else the default. The system namespace keeps nothing."""

    def __init__(
        self,
        default: RetentionPolicy = NO_RETENTION,
        namespaces: Mapping[str, RetentionPolicy] | None = None,
    ) -> None:
        self.default = default
        self.configured = dict(namespaces or {})
        self.overrides: dict[str, RetentionPolicy] = {}
        # Told the namespace whose policy changed, so the broker looks at its topics again.
        self.on_change: Callable[[str], None] | None = None

    def for_namespace(self, namespace: str) -> RetentionPolicy:
        if namespace.partition("/")[2] == SYSTEM_NAMESPACE:
            return NO_RETENTION
        found = self.overrides.get(namespace)
        if found is None:
            found = self.configured.get(namespace, self.default)
        return found

    def for_topic(self, topic: str) -> RetentionPolicy:
        return self.for_namespace(namespace_of(topic))

    def override(self, namespace: str, policy: RetentionPolicy | None) -> None:
        """Set (None: remove) the run-time policy of `namespace`."""
        if policy is None:
            self.overrides.pop(namespace, None)
        else:
            self.overrides[namespace] = policy
        if self.on_change is not None:
            self.on_change(namespace)

    def restore(self, saved: Iterable[tuple[str, bytes]]) -> None:
        """Load run-time overrides saved by an earlier process (a bad record is skipped)."""
        for namespace, raw in saved:
            try:
                self.overrides[namespace] = RetentionPolicy.from_json(raw)
            except (ValueError, KeyError, TypeError):
                continue


class RetentionControl(Protocol):
    """What the admin API may do with the retention policies of a broker node."""

    async def retention(self, namespace: str) -> RetentionPolicy:
        """The policy in force for `namespace`."""
        ...

    async def set_retention(self, namespace: str, policy: RetentionPolicy | None) -> None:
        """Override the policy of `namespace` (None: back to settings), durably."""
        ...
