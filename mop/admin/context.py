"""What the admin API may see of a node: a small explicit context, not the node itself."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mop.backlog_quota import BacklogQuotaControl
from mop.membership import Membership
from mop.observability import Telemetry
from mop.processor import MessagingProcessor
from mop.protocols.base import ProtocolHandler
from mop.protocols.introspection import AdminView
from mop.retention import RetentionControl
from mop.security.ban_store import BanStore
from mop.settings import Settings
from mop.transport import BoundListener


@dataclass(frozen=True, slots=True)
class AdminContext:
    settings: Settings
    processor: MessagingProcessor
    telemetry: Telemetry
    protocols: Mapping[str, ProtocolHandler]
    # The node's protocol listeners once bound (empty while the node starts).
    listeners: Callable[[], tuple[BoundListener, ...]]
    # Why the node is not ready to take clients now (empty: ready).
    not_ready: Callable[[], list[str]]
    started_at: float = field(default_factory=time.time)
    # The deployment's bans (None: the API cannot change them).
    bans: BanStore | None = None
    # On a broker (a merged node serving the Pulsar protocol): its cluster, for the routes of
    # Pulsar's admin REST API, which answer for the topics it owns. None on other nodes.
    broker: Membership | None = None
    # On a node with its own broker: its namespaces' retention policies. None on proxies.
    retention: RetentionControl | None = None
    # On a node with its own broker: its namespaces' backlog quotas. None on proxies.
    backlog_quotas: BacklogQuotaControl | None = None

    def views(self) -> dict[str, AdminView]:
        """Each protocol's clients and state, by protocol name."""
        return {name: handler.admin_view() for name, handler in self.protocols.items()}
