"""Wall-clock time as mop records it: milliseconds since the epoch.

What messages, session records and retained entries hold, as every node of a deployment sees it.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return int(time.time() * 1000)
