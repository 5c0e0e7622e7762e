"""What a running node's storage keeps, read from the node's own thread (for the tests of
retention and trimming)."""

from __future__ import annotations

from mop.testing.node import RunningNode


def stored_messages(node: RunningNode, topic: str) -> int:
    """How many messages of `topic` the node's storage still keeps."""
    storage = node.node.processor.backend.storage  # type: ignore[attr-defined]

    def count() -> int:
        index = storage.index.topics.get(topic)
        return 0 if index is None else int(index.count)

    return node.call(count)
