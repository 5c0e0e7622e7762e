"""MQTT topic names and filters: validation, matching, and the tries that route publishes.

Pure logic with no I/O, shared by the MQTT adapter, the broker and the Pulsar adapter.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

__all__ = [
    "TOPIC_FILTER_INVALID",
    "TOPIC_NAME_INVALID",
    "SharedFilter",
    "SubscriptionTrie",
    "TopicError",
    "TopicTree",
    "matches",
    "parse_shared",
    "validate_topic_filter",
    "validate_topic_name",
]

TOPIC_NAME_INVALID = 0x90
TOPIC_FILTER_INVALID = 0x8F

_SHARE_PREFIX = "$share/"
_MAX_SHOWN = 60

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TopicError(ValueError):
    """A topic name or filter broke the MQTT rules; `reason_code` is the MQTT 5 code to answer."""

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code


def _show(text: str) -> str:
    # Names can be 64 KiB long; an error message only needs enough to recognise one.
    if len(text) <= _MAX_SHOWN:
        return repr(text)
    return repr(text[:_MAX_SHOWN]) + "..."


def _check_text(text: str, what: str, code: int, max_length: int) -> None:
    if "\x00" in text:
        raise TopicError(code, f"{what} {_show(text)} contains U+0000")
    # The limit is in UTF-8 bytes, which is never less than the number of characters, so the
    # encoding (an allocation) is only needed for non-ASCII text under the limit.
    if len(text) > max_length:
        raise TopicError(code, f"{what} {_show(text)} is longer than {max_length} bytes")
    if not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise TopicError(code, f"{what} {_show(text)} is not valid UTF-8") from None
        if size > max_length:
            raise TopicError(code, f"{what} {_show(text)} is longer than {max_length} bytes")


def validate_topic_name(name: str, *, max_length: int = 65535, max_levels: int = 128) -> None:
    """Raise `TopicError` (0x90) unless `name` is a valid MQTT topic name to publish to."""
    if not name:
        raise TopicError(TOPIC_NAME_INVALID, "topic name is empty")
    if "+" in name or "#" in name:
        raise TopicError(
            TOPIC_NAME_INVALID, f"topic name {_show(name)} contains a wildcard ('+' or '#')"
        )
    _check_text(name, "topic name", TOPIC_NAME_INVALID, max_length)
    # n separators make n + 1 levels.
    if name.count("/") >= max_levels:
        raise TopicError(
            TOPIC_NAME_INVALID, f"topic name {_show(name)} has more than {max_levels} levels"
        )


def validate_topic_filter(
    topic_filter: str, *, max_length: int = 65535, max_levels: int = 128
) -> None:
    """Raise `TopicError` (0x8F) unless `topic_filter` is a valid MQTT subscription filter.

    `$share/{group}/{filter}` is accepted; `max_length` applies to the whole string and
    `max_levels` to the inner filter, the part that is matched against topic names.
    """
    if not topic_filter:
        raise TopicError(TOPIC_FILTER_INVALID, "topic filter is empty")
    inner = parse_shared(topic_filter).topic_filter
    _check_text(topic_filter, "topic filter", TOPIC_FILTER_INVALID, max_length)
    if inner.count("/") >= max_levels:
        raise TopicError(
            TOPIC_FILTER_INVALID,
            f"topic filter {_show(topic_filter)} has more than {max_levels} levels",
        )
    if "+" not in inner and "#" not in inner:
        return
    levels = inner.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if level == "+" or (level == "#" and index == last):
            continue
        if "#" in level:
            raise TopicError(
                TOPIC_FILTER_INVALID,
                f"topic filter {_show(topic_filter)}: '#' is allowed only as the whole last level",
            )
        if "+" in level:
            raise TopicError(
                TOPIC_FILTER_INVALID,
                f"topic filter {_show(topic_filter)}: '+' is allowed only as a whole level",
            )


@dataclass(frozen=True, slots=True)
class SharedFilter:
    """A filter split into its share group (None when not shared) and the filter it matches."""

    group: str | None
    topic_filter: str


def parse_shared(topic_filter: str) -> SharedFilter:
    """Split `$share/{group}/{filter}`; any other filter comes back whole with `group=None`.

    Raises `TopicError` (0x8F) when the `$share/` form is malformed. The inner filter itself is
    not checked here; `validate_topic_filter` does that.
    """
    if not topic_filter.startswith(_SHARE_PREFIX):
        return SharedFilter(None, topic_filter)
    group, sep, inner = topic_filter[len(_SHARE_PREFIX) :].partition("/")
    if not sep or not inner:
        raise TopicError(
            TOPIC_FILTER_INVALID,
            f"shared filter {_show(topic_filter)} must be $share/{{group}}/{{filter}}",
        )
    if not group:
        raise TopicError(
            TOPIC_FILTER_INVALID, f"shared filter {_show(topic_filter)} has an empty group"
        )
    if "+" in group or "#" in group:
        raise TopicError(
            TOPIC_FILTER_INVALID,
            f"shared filter {_show(topic_filter)}: the group must not contain '+' or '#'",
        )
    return SharedFilter(group, inner)


def _inner_levels(topic_filter: str) -> list[str]:
    if topic_filter.startswith(_SHARE_PREFIX):
        topic_filter = parse_shared(topic_filter).topic_filter
    return topic_filter.split("/")


def matches(topic_filter: str, topic: str) -> bool:
    """Whether a valid filter matches a valid topic name, with the MQTT rules.

    `sport/#` matches `sport`, `+` matches an empty level, a wildcard in the first level never
    matches a topic that starts with `$`, and `$share/{group}/{filter}` matches as `{filter}`.
    """
    if "+" not in topic_filter and "#" not in topic_filter:
        if topic_filter.startswith(_SHARE_PREFIX):
            return parse_shared(topic_filter).topic_filter == topic
        return topic_filter == topic
    levels = _inner_levels(topic_filter)
    if topic.startswith("$") and levels[0] in ("+", "#"):
        return False
    names = topic.split("/")
    count = len(names)
    for index, level in enumerate(levels):
        if level == "#":
            return True
        if index >= count or (level != "+" and level != names[index]):
            return False
    return len(levels) == count


# Each stored entry is kept as the tuple `match` returns, keyed by (filter, key), so that
# matching copies references into the result and allocates nothing per entry.
_Entries: TypeAlias = dict[tuple[str, K], tuple[str, K, V]]


class _Node(Generic[K, V]):
    """One level of the subscription trie; absent parts are None to keep idle nodes small."""

    __slots__ = ("children", "entries", "multi", "plus")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K, V]] | None = None
        self.plus: _Node[K, V] | None = None
        # '#' is always the last level, so the filters ending in '#' here need no node of
        # their own: they are the entries of this node's `multi`.
        self.multi: _Entries[K, V] | None = None
        self.entries: _Entries[K, V] | None = None

    def is_empty(self) -> bool:
        return (
            self.children is None
            and self.plus is None
            and self.multi is None
            and self.entries is None
        )


class SubscriptionTrie(Generic[K, V]):
    """Topic filters mapped to entries keyed by `K` (e.g. a client id), each with a value `V`.

    `match(topic)` walks one trie level per topic level, following the literal child, the `+`
    child and the `#` entries, so its cost depends on the topic and the matching filters, not
    on how many filters are stored. Filters are expected to be valid (`validate_topic_filter`);
    `$share/{group}/{filter}` is stored where `{filter}` is and reported by its full text.
    """

    __slots__ = ("_count", "_generation", "_root")

    def __init__(self) -> None:
        self._root: _Node[K, V] = _Node()
        self._count = 0
        self._generation = 0

    def __len__(self) -> int:
        return self._count

    @property
    def generation(self) -> int:
        """A number that changes whenever `match` results may change.

        Callers that cache match results (say, per topic) compare it instead of being told of
        every change. The trie keeps no cache itself: with many distinct topics a cache missed
        more often than it helped.
        """
        return self._generation

    def add(self, topic_filter: str, key: K, value: V) -> bool:
        """Store `value` for (`topic_filter`, `key`); True if new, False if it replaced one."""
        levels = _inner_levels(topic_filter)
        multi = levels[-1] == "#"
        if multi:
            levels.pop()
        node = self._root
        for level in levels:
            child: _Node[K, V] | None
            if level == "+":
                child = node.plus
                if child is None:
                    child = node.plus = _Node()
            else:
                children = node.children
                if children is None:
                    children = node.children = {}
                child = children.get(level)
                if child is None:
                    child = children[level] = _Node()
            node = child
        if multi:
            entries = node.multi
            if entries is None:
                entries = node.multi = {}
        else:
            entries = node.entries
            if entries is None:
                entries = node.entries = {}
        entry_key = (topic_filter, key)
        new = entry_key not in entries
        entries[entry_key] = (topic_filter, key, value)
        self._generation += 1
        if new:
            self._count += 1
        return new

    def remove(self, topic_filter: str, key: K) -> bool:
        """Forget (`topic_filter`, `key`); False if it was not stored. Empty nodes are pruned."""
        levels = _inner_levels(topic_filter)
        multi = levels[-1] == "#"
        if multi:
            levels.pop()
        path: list[tuple[_Node[K, V], str]] = []
        node = self._root
        for level in levels:
            child = node.plus if level == "+" else _child(node, level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        entries = node.multi if multi else node.entries
        entry_key = (topic_filter, key)
        if entries is None or entry_key not in entries:
            return False
        del entries[entry_key]
        self._count -= 1
        self._generation += 1
        if not entries:
            if multi:
                node.multi = None
            else:
                node.entries = None
        while path and node.is_empty():
            parent, level = path.pop()
            if level == "+":
                parent.plus = None
            else:
                children = parent.children
                assert children is not None
                del children[level]
                if not children:
                    parent.children = None
            node = parent
        return True

    def get(self, topic_filter: str, key: K) -> V | None:
        """The value stored for (`topic_filter`, `key`), or None."""
        levels = _inner_levels(topic_filter)
        multi = levels[-1] == "#"
        if multi:
            levels.pop()
        node: _Node[K, V] | None = self._root
        for level in levels:
            assert node is not None
            node = node.plus if level == "+" else _child(node, level)
            if node is None:
                return None
        assert node is not None
        entries = node.multi if multi else node.entries
        if entries is None:
            return None
        entry = entries.get((topic_filter, key))
        return None if entry is None else entry[2]

    def match(self, topic: str) -> list[tuple[str, K, V]]:
        """(filter, key, value) for every stored filter that matches the topic name `topic`."""
        found: list[tuple[str, K, V]] = []
        extend = found.extend
        levels = topic.split("/")
        root = self._root
        # The first level is handled apart because of the `$` rule: wildcards at the first
        # level never match a topic that starts with `$`.
        nodes: list[_Node[K, V]] = []
        first = levels[0]
        children = root.children
        if children is not None:
            child = children.get(first)
            if child is not None:
                nodes.append(child)
        if not first.startswith("$"):
            if root.multi is not None:
                extend(root.multi.values())
            if root.plus is not None:
                nodes.append(root.plus)
        for index in range(1, len(levels)):
            if not nodes:
                return found
            level = levels[index]
            following: list[_Node[K, V]] = []
            for node in nodes:
                # A '#' here matches because at least one more level remains.
                if node.multi is not None:
                    extend(node.multi.values())
                children = node.children
                if children is not None:
                    child = children.get(level)
                    if child is not None:
                        following.append(child)
                if node.plus is not None:
                    following.append(node.plus)
            nodes = following
        for node in nodes:
            if node.entries is not None:
                extend(node.entries.values())
            # `sport/#` also matches `sport` itself.
            if node.multi is not None:
                extend(node.multi.values())
        return found

    def filters(self) -> Iterator[str]:
        """Every distinct stored filter, once each (collected first, so the trie may change)."""
        found: list[str] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            for entries in (node.entries, node.multi):
                if entries is not None:
                    found.extend(dict.fromkeys(topic_filter for topic_filter, _ in entries))
            if node.children is not None:
                stack.extend(node.children.values())
            if node.plus is not None:
                stack.append(node.plus)
        return iter(found)


def _child(node: _Node[K, V], level: str) -> _Node[K, V] | None:
    children = node.children
    return None if children is None else children.get(level)


class _TopicNode:
    """One level of a `TopicTree`; `topic` is set when a stored name ends here."""

    __slots__ = ("children", "topic")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] | None = None
        self.topic: str | None = None

    def is_empty(self) -> bool:
        return self.topic is None and self.children is None


class TopicTree:
    """A set of topic names (e.g. those with a retained message) that can be queried by filter.

    Names are expected to be valid (`validate_topic_name`). A `$share/{group}/{filter}` query
    is answered for `{filter}`; MQTT sends no retained messages to shared subscriptions, so
    the caller decides whether to ask at all.
    """

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root = _TopicNode()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, topic: object) -> bool:
        if not isinstance(topic, str):
            return False
        node: _TopicNode | None = self._root
        for level in topic.split("/"):
            assert node is not None
            children = node.children
            node = None if children is None else children.get(level)
            if node is None:
                return False
        assert node is not None
        return node.topic is not None

    def add(self, topic: str) -> bool:
        """Store `topic`; True if it was not stored yet."""
        node = self._root
        for level in topic.split("/"):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _TopicNode()
            node = child
        if node.topic is not None:
            return False
        node.topic = topic
        self._count += 1
        return True

    def discard(self, topic: str) -> bool:
        """Forget `topic`; False if it was not stored. Empty nodes are pruned."""
        path: list[tuple[_TopicNode, str]] = []
        node = self._root
        for level in topic.split("/"):
            children = node.children
            child = None if children is None else children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.topic is None:
            return False
        node.topic = None
        self._count -= 1
        # A method rather than the test inline: after `node.topic = None` the type checker
        # takes `node.topic` for None through the loop, though `node` moves up, and a compiled
        # build would enforce that.
        while path and node.is_empty():
            parent, level = path.pop()
            children = parent.children
            assert children is not None
            del children[level]
            if not children:
                parent.children = None
            node = parent
        return True

    def match_filter(self, topic_filter: str) -> Iterator[str]:
        """Every stored topic that `topic_filter` matches, in no particular order.

        The matches are collected before the first one is returned, so the caller may add and
        discard topics while it iterates (e.g. across awaits while sending retained messages).
        """
        levels = _inner_levels(topic_filter)
        last = len(levels)
        found: list[str] = []
        stack: list[tuple[_TopicNode, int]] = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            if depth == last:
                if node.topic is not None:
                    found.append(node.topic)
                continue
            children = node.children
            level = levels[depth]
            if level == "#":
                # `sport/#` matches `sport` too; the root holds no topic, so this is safe there.
                if node.topic is not None:
                    found.append(node.topic)
                if children is not None:
                    _collect(children, depth == 0, found)
            elif children is None:
                continue
            elif level == "+":
                for name, child in children.items():
                    if depth == 0 and name.startswith("$"):
                        continue
                    stack.append((child, depth + 1))
            else:
                literal = children.get(level)
                if literal is not None:
                    stack.append((literal, depth + 1))
        return iter(found)


def _collect(children: dict[str, _TopicNode], at_root: bool, found: list[str]) -> None:
    """Append every topic below `children`; at the root, `$` topics are left out."""
    stack = [child for name, child in children.items() if not (at_root and name.startswith("$"))]
    while stack:
        node = stack.pop()
        if node.topic is not None:
            found.append(node.topic)
        if node.children is not None:
            stack.extend(node.children.values())
