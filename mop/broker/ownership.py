"""Which broker of a mop broker cluster owns a topic: rendezvous (highest random weight) hashing
of the canonical topic name over the static member list.

Every member computes the same answer from the same list, with no coordination: each (member,
topic) pair gets a score from a stable hash, and the member with the highest score owns the
topic. Adding a member moves only the topics it now wins (about 1/N of them); removing one moves
only its own topics. A cluster of one member, or of none, owns everything itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["Ownership", "normalize_url", "score"]


def normalize_url(url: str) -> str:
    """A member URL in the form used for hashing and comparing: no surrounding blanks, no
    trailing slash (`pulsar://h:6650/` and `pulsar://h:6650` are the same broker)."""
    return url.strip().rstrip("/")


def score(member: str, topic: str) -> int:
    """The weight of `member` for `topic`: the same on every host and in every process (unlike
    `hash()`, which is salted per process)."""
    digest = hashlib.blake2b(
        f"{member}\n{topic}".encode(), digest_size=8, person=b"mop-owner"
    ).digest()
    return int.from_bytes(digest, "big")


class Ownership:
    """Topic ownership over `members` (broker service URLs), seen from the broker `local`."""

    __slots__ = ("local", "members")

    def __init__(self, members: Iterable[str], local: str) -> None:
        self.local = normalize_url(local)
        # Sorted, so that ties (which a 64-bit hash makes vanishingly rare) break the same way
        # on every member whatever the order of its list.
        self.members: tuple[str, ...] = tuple(sorted({normalize_url(m) for m in members}))

    @property
    def clustered(self) -> bool:
        """Whether topics are spread over several brokers."""
        return len(self.members) > 1

    def owner(self, topic: str) -> str:
        """The URL of the member that owns `topic` (a canonical, fully qualified name)."""
        if not self.clustered:
            return self.local
        return max(self.members, key=lambda member: score(member, topic))

    def owns(self, topic: str) -> bool:
        return self.owner(topic) == self.local

    def peers(self) -> tuple[str, ...]:
        """The other members."""
        return tuple(member for member in self.members if member != self.local)
