"""What the tests of the local backend's consumer and producer share: one topic, and the
subscription spec of a plain consumer of it."""

from __future__ import annotations

from mop.processor.backend import SubscriptionSpec

T = "persistent://public/default/t"


def spec(name: str = "s", **fields: object) -> SubscriptionSpec:
    return SubscriptionSpec(name=name, selectors=frozenset([T]), **fields)  # type: ignore[arg-type]
