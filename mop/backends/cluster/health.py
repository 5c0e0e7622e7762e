"""Whether the brokers can be reached, for a proxy's readiness (`/readyz`): every `interval`
seconds the proxy's Pulsar client is asked for a connection to one of the service URL's
brokers. An open connection answers at once (a broker that stops closes it, and the client
notices); without one, a new connection is tried, bounded by the client's connect timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from mop.messaging import BackendError
from mop.protocols.pulsar.driver import DriverError

__all__ = ["BrokerHealth"]

log = logging.getLogger("mop.cluster")

CHECK_INTERVAL: Final = 1.0


class BrokerHealth:
    """The outcome of the last check; `problems` is empty while the brokers answer."""

    def __init__(self, service_url: str, *, interval: float = CHECK_INTERVAL) -> None:
        self.service_url = service_url
        self.interval = interval
        self.problems: list[str] = []

    async def serve(
        self,
        reach: Callable[[], Awaitable[object]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Check with `reach()` (a connection to some broker; DriverError or BackendError
        when there is none) until cancelled."""
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            try:
                await reach()
            except (DriverError, BackendError) as exc:
                if not self.problems:
                    log.warning("the brokers at %s cannot be reached: %s", self.service_url, exc)
                self.problems = [f"the brokers at {self.service_url} cannot be reached: {exc}"]
            else:
                if self.problems:
                    log.info("the brokers at %s can be reached again", self.service_url)
                self.problems = []
