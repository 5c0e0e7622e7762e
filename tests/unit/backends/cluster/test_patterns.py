"""Selectors -> what a separated-mode consumer follows (exact topics, filters for the topic
poller, node-local `$SYS` topics), and topics -> the selectors that match them."""

from __future__ import annotations

import pytest

from mop.backends.cluster.patterns import (
    UnsupportedSelector,
    is_local,
    matching_selectors,
    plan,
)
from mop.topic_names import mqtt_to_pulsar


def test_a_full_pulsar_name_is_exact() -> None:
    # Its "+" is an encoded space, as in merged mode, never a wildcard.
    assert plan(["persistent://public/default/a+b"]).exact == {"persistent://public/default/a+b"}


def test_exact_selectors_name_their_topics() -> None:
    assert plan(["a/b"]).exact == {"persistent://public/default/a%2Fb"}
    assert plan(["persistent://public/other/x"]).exact == {"persistent://public/other/x"}
    assert plan(["a/b"], namespace="ns").exact == {"persistent://public/ns/a%2Fb"}


def test_selectors_are_split_into_exact_filters_and_local() -> None:
    result = plan(
        ["a/+", "persistent://public/other/x.y", "b", "$SYS/#", "$SYS/broker/uptime", "#"]
    )
    assert result.exact == {"persistent://public/other/x.y", "persistent://public/default/b"}
    assert result.filters == {"a/+", "#"}
    assert result.local == {"$SYS/#", "$SYS/broker/uptime"}


def test_sys_in_pulsar_form_is_local_too() -> None:
    name = mqtt_to_pulsar("$SYS/broker/version")
    assert plan([name]) == plan(["$SYS/broker/version"])
    # Only the node's own namespace: elsewhere it is an ordinary topic.
    other = mqtt_to_pulsar("$SYS/broker/version", namespace="other")
    assert plan([other]).exact == {other}


@pytest.mark.parametrize(
    ("topic", "local"),
    [
        ("$SYS", True),
        ("$SYS/broker/x", True),
        ("$SYS/#", True),
        ("$SYSx/a", False),
        ("a/$SYS", False),
        ("#", False),
        ("+/broker", False),
    ],
)
def test_local_topics_are_those_under_sys(topic: str, local: bool) -> None:
    assert is_local(topic) is local


@pytest.mark.parametrize(
    "selectors",
    [
        [],
        ["non-persistent://public/default/x"],
        ["a", "non-persistent://public/default/x"],
    ],
)
def test_unsupported_selectors(selectors: list[str]) -> None:
    with pytest.raises(UnsupportedSelector):
        plan(selectors)


def test_matching_selectors_follow_merged_mode_rules() -> None:
    topic = "persistent://public/default/a%2Fb"
    selectors = ["a/+", "a/b", "persistent://public/default/a%2Fb", "b/#", "#"]
    assert matching_selectors(topic, selectors) == [
        "a/+",
        "a/b",
        "persistent://public/default/a%2Fb",
        "#",
    ]
    # A topic of another namespace has its full name as its MQTT name.
    assert matching_selectors("persistent://public/other/x", ["x", "+"]) == []
