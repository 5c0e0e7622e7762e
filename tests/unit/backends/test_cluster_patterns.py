"""MQTT filters -> pulsar-client topic patterns: the pattern matches exactly the encoded names
of the topics the filter matches (checked against `mop.topics.matches`)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mop.backends.cluster_patterns import (
    UnsupportedSelector,
    filter_pattern,
    matching_selectors,
    plan,
)
from mop.topic_names import mqtt_to_pulsar
from mop.topics import matches

# Levels built from characters that stress the encoding: separators' look-alikes, regex
# punctuation, "$", "%", spaces, and non-ASCII text.
LEVEL_CHARS = st.sampled_from([*"ab$%+.*?()[]{}|^\\ -_~é€F2", "\u4e2d"])
LEVELS = st.text(LEVEL_CHARS, max_size=4)


def topic_names() -> st.SearchStrategy[str]:
    return st.lists(LEVELS, min_size=1, max_size=4).map("/".join).filter(
        lambda t: t and "+" not in t and "#" not in t
    )


def topic_filters() -> st.SearchStrategy[str]:
    level = st.one_of(LEVELS.filter(lambda s: "+" not in s and "#" not in s), st.just("+"))
    levels = st.lists(level, min_size=1, max_size=4)
    tail = st.sampled_from(["", "#"])
    joined = st.tuples(levels, tail).map(lambda p: "/".join(p[0] + ([p[1]] if p[1] else [])))
    return joined.filter(bool)  # "" is no filter


def local_name(topic: str) -> str:
    return mqtt_to_pulsar(topic).rpartition("/")[2]


def pattern_matches(topic_filter: str, topic: str) -> bool:
    return re.fullmatch(filter_pattern(topic_filter), local_name(topic)) is not None


@given(topic_filters(), topic_names())
def test_filter_pattern_agrees_with_mqtt_matching(topic_filter: str, topic: str) -> None:
    assert pattern_matches(topic_filter, topic) == matches(topic_filter, topic)


@given(topic_filters(), topic_names())
def test_plan_pattern_agrees_with_mqtt_matching(topic_filter: str, topic: str) -> None:
    (pattern,) = plan([topic_filter, "other/#"]).patterns.values()
    # pulsar-client matches the whole name without its domain.
    name = mqtt_to_pulsar(topic).removeprefix("persistent://")
    expected = matches(topic_filter, topic) or matches("other/#", topic)
    assert (re.fullmatch(pattern, name) is not None) == expected


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("sport/#", "sport", True),
        ("sport/#", "sport/tennis/player1", True),
        ("sport/#", "sports", False),
        ("sport/+", "sport/", True),
        ("sport/+", "sport/a/b", False),
        ("+/+", "/finance", True),
        ("#", "$SYS/uptime", False),
        ("+/uptime", "$SYS/uptime", False),
        ("$SYS/#", "$SYS/uptime", True),
        ("a/+/c", "a/%2F/c", True),  # a "%" in a name is encoded, never a separator
        ("a b/+", "a b/x", True),
        ("\u4e2d/#", "\u4e2d/x", True),
        ("a.b", "aXb", False),  # regex punctuation is literal
    ],
)
def test_filter_pattern_examples(topic_filter: str, topic: str, expected: bool) -> None:
    assert pattern_matches(topic_filter, topic) is expected


def test_a_full_pulsar_name_is_exact() -> None:
    # Its "+" is an encoded space, as in merged mode, never a wildcard.
    assert plan(["persistent://public/default/a+b"]).single == "persistent://public/default/a+b"


def test_a_lone_exact_selector_is_a_plain_consumer() -> None:
    assert plan(["a/b"]).single == "persistent://public/default/a%2Fb"
    assert plan(["persistent://public/other/x"]).single == "persistent://public/other/x"
    assert plan(["a/b"], namespace="ns").single == "persistent://public/ns/a%2Fb"


def test_patterns_are_grouped_by_namespace() -> None:
    result = plan(["a/+", "persistent://public/other/x.y", "b"])
    assert result.single is None
    assert set(result.patterns) == {"public/default", "public/other"}
    assert result.patterns["public/other"] == r"public/other/(?:x\.y)"
    default = result.patterns["public/default"]
    assert re.fullmatch(default, "public/default/b")
    assert re.fullmatch(default, "public/default/a%2Fz")
    assert not re.fullmatch(default, "public/default/c")


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
