"""A separated proxy's view of its brokers' namespace policies (retention, backlog quotas):
read from, and changed on, the brokers' HTTP admin (`cluster.admin_url`) in Apache Pulsar's
admin REST API, so the proxy's admin API answers `/admin/v2/namespaces/...` as a broker does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mop.backends.cluster.topic_admin import BrokerAdmin
from mop.backlog_quota import BacklogQuota, QuotaKind, QuotaPolicy
from mop.messaging import BackendError
from mop.protocols.pulsar.admin_rest import (
    ADMIN_PREFIX,
    retention_document,
    retention_from_document,
)
from mop.retention import RetentionPolicy

__all__ = ["NamespaceAdmin"]


def _path(namespace: str, resource: str) -> str:
    return f"{ADMIN_PREFIX}/namespaces/{namespace}/{resource}"


def _bad_answer(namespace: str, exc: Exception) -> BackendError:
    return BackendError(f"the brokers' policy of {namespace}: {exc}", reason="bad_answer")


class NamespaceAdmin:
    """`RetentionControl` and `BacklogQuotaControl` through the brokers' HTTP admin."""

    def __init__(self, admin: BrokerAdmin) -> None:
        self._admin = admin

    async def retention(self, namespace: str) -> RetentionPolicy:
        document = await self._admin.namespace_read(_path(namespace, "retention"))
        if document is None:  # Apache Pulsar: no policy of the namespace's own
            return RetentionPolicy(0, 0)
        try:
            return retention_from_document(document)
        except ValueError as exc:
            raise _bad_answer(namespace, exc) from None

    async def set_retention(self, namespace: str, policy: RetentionPolicy | None) -> None:
        path = _path(namespace, "retention")
        if policy is None:
            await self._admin.namespace_change("DELETE", path)
        else:
            await self._admin.namespace_change("POST", path, retention_document(policy))

    async def backlog_quotas(self, namespace: str) -> Mapping[QuotaKind, BacklogQuota]:
        document: Any = await self._admin.namespace_read(_path(namespace, "backlogQuotaMap"))
        quotas: dict[QuotaKind, BacklogQuota] = {}
        try:
            for name, quota in (document or {}).items():
                kind = QuotaKind(name)
                limit = quota["limitSize"] if kind is QuotaKind.SIZE else quota["limitTime"]
                quotas[kind] = BacklogQuota(int(limit), QuotaPolicy(quota["policy"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise _bad_answer(namespace, exc) from None
        return quotas

    async def set_backlog_quota(
        self, namespace: str, kind: QuotaKind, quota: BacklogQuota | None
    ) -> None:
        path = _path(namespace, "backlogQuota")
        params = {"backlogQuotaType": kind.value}
        if quota is None:
            await self._admin.namespace_change("DELETE", path, params=params)
            return
        body = {
            "limitSize": quota.limit if kind is QuotaKind.SIZE else -1,
            "limitTime": quota.limit if kind is QuotaKind.AGE else -1,
            "policy": quota.policy.value,
        }
        await self._admin.namespace_change("POST", path, body, params)
