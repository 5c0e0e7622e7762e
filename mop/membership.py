"""The brokers of a merged-mode cluster, this broker among them, and which one owns a topic:
rendezvous (highest random weight) hashing of the canonical topic name over the static member
list.

Every member computes the same answer from the same list, with no coordination: each (member,
topic) pair gets a score from a stable hash, and the member with the highest score owns the
topic. Adding a member moves only the topics it now wins (about 1/N of them); removing one moves
only its own topics. A cluster of one member, or of none, owns everything itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["Membership", "MembershipError", "normalize_url", "score"]


class MembershipError(ValueError):
    """The cluster settings do not describe a cluster this broker can be part of."""


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


class Membership:
    """The cluster `members` (broker service URLs) seen from the broker whose URL is
    `advertised_url`. The node makes one and hands it to the parts that need it; `url` is
    `advertised_url` in the form members are compared in."""

    __slots__ = ("advertised_url", "members", "url")

    def __init__(self, members: Iterable[str], advertised_url: str) -> None:
        # Sorted, so that ties (which a 64-bit hash makes vanishingly rare) break the same way
        # on every member whatever the order of its list.
        self.members: tuple[str, ...] = tuple(sorted({normalize_url(m) for m in members}))
        self.advertised_url = advertised_url
        self.url = normalize_url(advertised_url)

    def advertise(self, url: str) -> None:
        """Change this broker's URL (the node does, once a listener bound port 0)."""
        self.advertised_url = url
        self.url = normalize_url(url)

    def check(self) -> None:
        """Raise MembershipError unless this broker is one of the members of a cluster of
        several (the message is one line, naming the settings to fix)."""
        if self.clustered and self.url not in self.members:
            raise MembershipError(
                f"cluster.advertised_url {self.advertised_url!r} is not one of cluster.brokers"
                " (set it to this broker's URL in that list)"
            )

    @property
    def clustered(self) -> bool:
        """Whether topics are spread over several brokers."""
        return len(self.members) > 1

    def owner(self, topic: str) -> str:
        """The URL of the member that owns `topic` (a canonical, fully qualified name)."""
        if not self.clustered:
            return self.url
        return max(self.members, key=lambda member: score(member, topic))

    def owns(self, topic: str) -> bool:
        return self.owner(topic) == self.url

    def peers(self) -> tuple[str, ...]:
        """The other members (none when this broker is not in a cluster of several)."""
        if not self.clustered:
            return ()
        return tuple(member for member in self.members if member != self.url)
