"""Tests of MQTT topic validation, matching, `SubscriptionTrie` and `TopicTree`.

Matching is checked against the examples of MQTT 5.0 section 4.7 and, with generated filters
and topics, against a reference matcher built on regular expressions.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mop.topics import (
    TOPIC_FILTER_INVALID,
    TOPIC_NAME_INVALID,
    SharedFilter,
    SubscriptionTrie,
    TopicError,
    TopicTree,
    matches,
    parse_shared,
    validate_topic_filter,
    validate_topic_name,
)

# --- reference matcher -------------------------------------------------------------------------


def reference_matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching restated as a regular expression over the whole topic name."""
    if topic_filter.startswith("$share/"):
        topic_filter = topic_filter.split("/", 2)[2]
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    if topic_filter == "#":
        return True
    pattern = ""
    if topic_filter.endswith("/#"):
        topic_filter = topic_filter[:-2]
        suffix = "(?:/.*)?"
    else:
        suffix = ""
    pattern = "/".join(
        "[^/]*" if level == "+" else re.escape(level) for level in topic_filter.split("/")
    )
    return re.fullmatch(pattern + suffix, topic, re.DOTALL) is not None


# --- the examples of MQTT 5.0 section 4.7 ------------------------------------------------------

SPEC_CASES = [
    # 4.7.1.2 multi-level wildcard
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    # 4.7.1.3 single-level wildcard
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("sport/+/player1", "sport/tennis/player1", True),
    ("+/tennis/#", "sport/tennis/player1/ranking", True),
    ("+/tennis/#", "sport/tennis", True),
    # 4.7.2 topics beginning with $
    ("#", "$SYS/monitor/Clients", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("+", "$SYS", False),
    ("$SYS/#", "$SYS", True),
    ("a/+", "a/$b", True),  # the rule is about the first level only
    # 4.7.3 topic semantics
    ("ACCOUNTS", "Accounts", False),
    ("Accounts payable", "Accounts payable", True),
    ("/finance", "finance", False),
    ("finance", "finance", True),
    # empty levels
    ("+/+/+", "//", True),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    # shared subscriptions match as their inner filter
    ("$share/g/sport/+", "sport/tennis", True),
    ("$share/g/#", "sport/tennis", True),
    ("$share/g/#", "$SYS/x", False),
    ("$share/g/$SYS/#", "$SYS/x", True),
    ("$share/g/a", "a", True),
    ("$share/g/a", "$share/g/a", False),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), SPEC_CASES)
def test_spec_examples(topic_filter: str, topic: str, expected: bool) -> None:
    validate_topic_filter(topic_filter)
    validate_topic_name(topic)
    assert matches(topic_filter, topic) is expected
    assert reference_matches(topic_filter, topic) is expected

    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    trie.add(topic_filter, "client", 1)
    assert trie.match(topic) == ([(topic_filter, "client", 1)] if expected else [])

    tree = TopicTree()
    tree.add(topic)
    assert list(tree.match_filter(topic_filter)) == ([topic] if expected else [])


# --- validation ----------------------------------------------------------------------------------

VALID_NAMES = ["a", "/", "a/b/c", "$SYS/broker", "a//b", "Accounts payable", "é/ü", "a$b"]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "empty"),
        ("a/+", "wildcard"),
        ("a/#", "wildcard"),
        ("sport+", "wildcard"),
        ("a\x00b", "U+0000"),
        ("a\ud800", "UTF-8"),
    ],
)
def test_invalid_topic_names(name: str, fragment: str) -> None:
    with pytest.raises(TopicError, match=re.escape(fragment)) as info:
        validate_topic_name(name)
    assert info.value.reason_code == TOPIC_NAME_INVALID == 0x90
    assert isinstance(info.value, ValueError)


VALID_FILTERS = [
    "#",
    "+",
    "a",
    "/",
    "+/+",
    "sport/#",
    "sport/tennis/#",
    "sport/+/player1",
    "+/tennis/#",
    "/+",
    "$SYS/#",
    "a//b",
    "$share/group/a/b",
    "$share/group/#",
    "$share/g/+/x",
    "$share",  # no slash: an ordinary one-level filter
    "$sharex/a",
]


@pytest.mark.parametrize("topic_filter", VALID_FILTERS)
def test_valid_topic_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    ("topic_filter", "fragment"),
    [
        ("", "empty"),
        ("sport/tennis#", "'#'"),
        ("sport/tennis/#/ranking", "'#'"),
        ("#/a", "'#'"),
        ("a/#/", "'#'"),
        ("sport+", "'+'"),
        ("a/+b/c", "'+'"),
        ("a\x00", "U+0000"),
        ("a\udfff", "UTF-8"),
        ("$share/", "$share/{group}/{filter}"),
        ("$share/group", "$share/{group}/{filter}"),
        ("$share/group/", "$share/{group}/{filter}"),
        ("$share//a", "empty group"),
        ("$share/g+/a", "group"),
        ("$share/g#/a", "group"),
        ("$share/g/a#", "'#'"),
        ("$share/g/a/+b", "'+'"),
    ],
)
def test_invalid_topic_filters(topic_filter: str, fragment: str) -> None:
    with pytest.raises(TopicError, match=re.escape(fragment)) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code == TOPIC_FILTER_INVALID == 0x8F


def test_length_is_counted_in_utf8_bytes() -> None:
    validate_topic_name("é" * 5, max_length=10)
    validate_topic_filter("é" * 5, max_length=10)
    with pytest.raises(TopicError, match="longer than 10 bytes") as name_error:
        validate_topic_name("é" * 5 + "a", max_length=10)
    assert name_error.value.reason_code == TOPIC_NAME_INVALID
    with pytest.raises(TopicError, match="longer than 10 bytes") as filter_error:
        validate_topic_filter("é" * 5 + "a", max_length=10)
    assert filter_error.value.reason_code == TOPIC_FILTER_INVALID
    with pytest.raises(TopicError, match="longer than 3 bytes"):
        validate_topic_name("abcd", max_length=3)
    validate_topic_name("a" * 65535)
    with pytest.raises(TopicError):
        validate_topic_name("a" * 65536)


def test_level_limit() -> None:
    validate_topic_name("/".join("a" * 3), max_levels=3)
    validate_topic_filter("a/+/#", max_levels=3)
    with pytest.raises(TopicError, match="more than 3 levels") as name_error:
        validate_topic_name("a/b/c/d", max_levels=3)
    assert name_error.value.reason_code == TOPIC_NAME_INVALID
    with pytest.raises(TopicError, match="more than 3 levels") as filter_error:
        validate_topic_filter("a/b/c/#", max_levels=3)
    assert filter_error.value.reason_code == TOPIC_FILTER_INVALID
    # The levels of a shared filter are those of the filter inside it.
    validate_topic_filter("$share/g/a/b/c", max_levels=3)
    validate_topic_name("/" * 127)
    with pytest.raises(TopicError):
        validate_topic_name("/" * 128)


def test_long_names_are_shortened_in_messages() -> None:
    with pytest.raises(TopicError) as info:
        validate_topic_name("x" * 70000 + "+")
    assert len(str(info.value)) < 200


# --- shared filters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("a/b", SharedFilter(None, "a/b")),
        ("#", SharedFilter(None, "#")),
        ("$share", SharedFilter(None, "$share")),
        ("$SYS/#", SharedFilter(None, "$SYS/#")),
        ("$share/g/a/b", SharedFilter("g", "a/b")),
        ("$share/consumers/#", SharedFilter("consumers", "#")),
        ("$share/g//", SharedFilter("g", "/")),
    ],
)
def test_parse_shared(topic_filter: str, expected: SharedFilter) -> None:
    assert parse_shared(topic_filter) == expected


def test_parse_shared_rejects_malformed() -> None:
    for topic_filter in ("$share/", "$share/g", "$share//x", "$share/+/x"):
        with pytest.raises(TopicError) as info:
            parse_shared(topic_filter)
        assert info.value.reason_code == TOPIC_FILTER_INVALID


# --- SubscriptionTrie ----------------------------------------------------------------------------


def test_trie_add_replace_get_remove() -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    assert len(trie) == 0
    assert trie.add("a/+", "c1", 0)
    assert trie.add("a/+", "c2", 1)
    assert not trie.add("a/+", "c1", 2)  # replaces
    assert trie.add("a/#", "c1", 1)
    assert trie.add("$share/g/a/+", "c1", 1)
    assert len(trie) == 4
    assert trie.get("a/+", "c1") == 2
    assert trie.get("a/#", "c1") == 1
    assert trie.get("a/#", "c3") is None
    assert trie.get("a/b", "c1") is None
    assert trie.get("b/+/c", "c1") is None
    assert sorted(trie.match("a/x")) == [
        ("$share/g/a/+", "c1", 1),
        ("a/#", "c1", 1),
        ("a/+", "c1", 2),
        ("a/+", "c2", 1),
    ]
    assert sorted(trie.filters()) == ["$share/g/a/+", "a/#", "a/+"]
    assert not trie.remove("a/+", "c3")
    assert not trie.remove("a/b/c", "c1")
    assert not trie.remove("x/#", "c1")
    assert trie.remove("a/+", "c1")
    assert not trie.remove("a/+", "c1")
    assert len(trie) == 3
    assert trie.match("a") == [("a/#", "c1", 1)]


def test_trie_generation_changes_with_content() -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    before = trie.generation
    trie.add("a", "c", 1)
    after_add = trie.generation
    assert after_add != before
    trie.add("a", "c", 2)
    assert trie.generation != after_add
    unchanged = trie.generation
    trie.remove("b", "c")
    trie.match("a")
    assert trie.generation == unchanged
    trie.remove("a", "c")
    assert trie.generation != unchanged


def test_trie_handles_very_deep_filters() -> None:
    # Walks are loops, not recursion, so a limit raised far above 128 levels is safe.
    deep = "/".join(["x"] * 5000)
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    trie.add(deep, "c", 1)
    trie.add(deep + "/#", "c", 2)
    trie.add("+/" * 4999 + "+", "c", 3)
    assert sorted(value for _, _, value in trie.match(deep)) == [1, 2, 3]
    assert trie.remove(deep, "c") and trie.remove(deep + "/#", "c")
    assert trie.remove("+/" * 4999 + "+", "c")
    assert_trie_pruned(trie)
    tree = TopicTree()
    tree.add(deep)
    assert list(tree.match_filter("#")) == [deep]
    assert tree.discard(deep)
    assert_tree_shape(tree, set())


# --- generated filters and topics ---------------------------------------------------------------

topic_levels = st.sampled_from(["", "a", "b", "$", "$a", "a$"])
topics = st.lists(topic_levels, min_size=1, max_size=4).map("/".join).filter(bool)
filter_levels = st.sampled_from(["", "a", "b", "$a", "+"])


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(filter_levels, min_size=0, max_size=4))
    # One empty level would make the empty string, which is no filter.
    if draw(st.booleans()) or levels in ([], [""]):
        levels.append("#")
    text = "/".join(levels)
    if draw(st.integers(0, 4)) == 0:
        text = f"$share/{draw(st.sampled_from(['g1', 'g2']))}/{text}"
    return text


keys = st.sampled_from(["c1", "c2", "c3"])


@given(topic_filters(), topics)
def test_matches_equals_reference(topic_filter: str, topic: str) -> None:
    validate_topic_filter(topic_filter)
    validate_topic_name(topic)
    assert matches(topic_filter, topic) == reference_matches(topic_filter, topic)


@given(st.lists(st.tuples(topic_filters(), keys, st.integers(0, 2))), st.lists(topics))
def test_trie_match_equals_brute_force(
    subscriptions: list[tuple[str, str, int]], probes: list[str]
) -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    model: dict[tuple[str, str], int] = {}
    for topic_filter, key, value in subscriptions:
        trie.add(topic_filter, key, value)
        model[topic_filter, key] = value
    for topic in probes:
        expected = sorted(
            (topic_filter, key, value)
            for (topic_filter, key), value in model.items()
            if reference_matches(topic_filter, topic)
        )
        assert sorted(trie.match(topic)) == expected


operations = st.lists(
    st.tuples(st.sampled_from(["add", "remove"]), topic_filters(), keys, st.integers(0, 2)),
    max_size=60,
)


@settings(max_examples=300)
@given(operations)
def test_trie_follows_model_and_prunes(ops: list[tuple[str, str, str, int]]) -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    model: dict[tuple[str, str], int] = {}
    for op, topic_filter, key, value in ops:
        if op == "add":
            assert trie.add(topic_filter, key, value) == ((topic_filter, key) not in model)
            model[topic_filter, key] = value
        else:
            assert trie.remove(topic_filter, key) == ((topic_filter, key) in model)
            model.pop((topic_filter, key), None)
        assert len(trie) == len(model)
    for (topic_filter, key), value in model.items():
        assert trie.get(topic_filter, key) == value
    assert sorted(trie.filters()) == sorted({topic_filter for topic_filter, _ in model})
    # Whatever the history, the trie has the shape of one built from its content alone, so
    # removals leave no empty nodes behind.
    fresh: SubscriptionTrie[str, int] = SubscriptionTrie()
    for (topic_filter, key), value in model.items():
        fresh.add(topic_filter, key, value)
    assert trie_shape(trie) == trie_shape(fresh)
    for topic_filter, key in list(model):
        assert trie.remove(topic_filter, key)
    assert len(trie) == 0
    assert_trie_pruned(trie)


def trie_shape(trie: SubscriptionTrie[Any, Any]) -> Any:
    # White-box: reads the node slots to compare structure, not just behaviour.
    def shape(node: Any) -> Any:
        children = node.children
        return (
            None if children is None else {name: shape(c) for name, c in children.items()},
            None if node.plus is None else shape(node.plus),
            node.multi,
            node.entries,
        )

    return shape(trie._root)


def assert_trie_pruned(trie: SubscriptionTrie[Any, Any]) -> None:
    assert trie_shape(trie) == (None, None, None, None)


# --- TopicTree ---------------------------------------------------------------------------------


def test_tree_basics() -> None:
    tree = TopicTree()
    assert tree.add("a/b")
    assert not tree.add("a/b")
    assert tree.add("a")
    assert tree.add("$SYS/x")
    assert len(tree) == 3
    assert "a/b" in tree and "a" in tree and "$SYS/x" in tree
    assert "a/b/c" not in tree and "$SYS" not in tree and "" not in tree
    assert 1 not in tree
    assert sorted(tree.match_filter("#")) == ["a", "a/b"]
    assert sorted(tree.match_filter("a/#")) == ["a", "a/b"]
    assert sorted(tree.match_filter("+/+")) == ["a/b"]
    assert sorted(tree.match_filter("$SYS/#")) == ["$SYS/x"]
    assert sorted(tree.match_filter("$share/g/a/+")) == ["a/b"]
    assert tree.discard("a")
    assert not tree.discard("a")
    assert not tree.discard("a/b/c")
    assert "a/b" in tree
    assert len(tree) == 2


def test_tree_may_change_while_iterating() -> None:
    tree = TopicTree()
    for index in range(100):
        tree.add(f"t/{index}")
    seen = []
    for topic in tree.match_filter("t/+"):
        seen.append(topic)
        tree.discard(topic)
        tree.add(topic + "/child")
    assert len(seen) == 100
    assert len(tree) == 100


tree_ops = st.lists(st.tuples(st.sampled_from(["add", "discard"]), topics), max_size=60)


@settings(max_examples=300)
@given(tree_ops, st.lists(topic_filters(), max_size=8))
def test_tree_follows_model(ops: list[tuple[str, str]], probes: list[str]) -> None:
    tree = TopicTree()
    model: set[str] = set()
    for op, topic in ops:
        if op == "add":
            assert tree.add(topic) == (topic not in model)
            model.add(topic)
        else:
            assert tree.discard(topic) == (topic in model)
            model.discard(topic)
        assert len(tree) == len(model)
    for _, topic in ops:
        assert (topic in tree) == (topic in model)
    for topic_filter in probes:
        found = list(tree.match_filter(topic_filter))
        assert len(found) == len(set(found))
        assert set(found) == {topic for topic in model if matches(topic_filter, topic)}
        assert set(found) == {topic for topic in model if reference_matches(topic_filter, topic)}
    assert_tree_shape(tree, model)
    for topic in list(model):
        assert tree.discard(topic)
    assert_tree_shape(tree, set())


def tree_shape(tree: TopicTree) -> Any:
    # White-box, as for the trie.
    def shape(node: Any) -> Any:
        children = node.children
        return (
            node.topic,
            None if children is None else {name: shape(c) for name, c in children.items()},
        )

    return shape(tree._root)


def assert_tree_shape(tree: TopicTree, content: set[str]) -> None:
    fresh = TopicTree()
    for topic in content:
        fresh.add(topic)
    assert tree_shape(tree) == tree_shape(fresh)
    if not content:
        assert tree_shape(tree) == (None, None)
