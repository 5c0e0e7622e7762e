"""How far retention lets a topic's acknowledged history go (`mop.retention`): the broker knows
what every subscription acknowledged, the storage knows each kept message's age and size.
"""

from __future__ import annotations

from mop.broker.storage.api import Storage
from mop.message import MessageId
from mop.retention import INFINITE, RetentionPolicy

__all__ = ["history_cut"]


def history_cut(
    storage: Storage,
    topic: str,
    acknowledged: MessageId | None,
    policy: RetentionPolicy,
    now: float,
) -> MessageId | None:
    """The last id of `topic` to trim now (None: nothing): never past `acknowledged` (what
    every subscription acknowledged), and of that only what is older than the policy's time
    limit at `now` (wall clock, s) or beyond its size limit."""
    if acknowledged is None or policy.keeps_everything:
        return None
    if policy.keeps_nothing:
        return acknowledged
    seconds, size = policy.time_seconds, policy.size_bytes
    cut = storage.retention_cut(
        topic,
        appended_before=None if seconds == INFINITE else int(now) - seconds,
        keep_bytes=None if size == INFINITE else size,
    )
    if cut is None:
        return None
    return min(cut, acknowledged)
