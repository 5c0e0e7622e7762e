"""Retention policies and backlog quotas through a separated proxy's admin API: the proxy
forwards Pulsar's namespace admin calls to every broker of `cluster.admin_url` (each mop broker
keeps its own policies), reads them back from the first one, and says which setting is missing
without it."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from tests.e2e.cluster.support import two_brokers
from tests.e2e.cluster.test_admin_topics import proxy
from tests.e2e.nodeproc import broker_process

pytestmark = pytest.mark.e2e

RETENTION = "/admin/v2/namespaces/public/{namespace}/retention"
QUOTAS = "/admin/v2/namespaces/public/{namespace}/backlogQuotaMap"
QUOTA = "/admin/v2/namespaces/public/{namespace}/backlogQuota"


def test_policies_set_through_the_proxy_reach_every_broker(tmp_path: Path) -> None:
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    urls, admins, brokers = two_brokers(tmp_path)
    retention = RETENTION.format(namespace=namespace)
    quotas, quota = QUOTAS.format(namespace=namespace), QUOTA.format(namespace=namespace)
    try:
        for broker in brokers:
            broker.start()
        service_url = "pulsar://" + ",".join(url.removeprefix("pulsar://") for url in urls)
        with proxy(service_url, ",".join(admins), namespace) as (_, http):
            assert http.get(retention).json() == {
                "retentionTimeInMinutes": 1440,
                "retentionSizeInMB": 256,
            }
            policy = {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}
            assert http.post(retention, json=policy).status_code == 204
            body = {"limitSize": 1000, "policy": "producer_exception"}
            assert http.post(quota, json=body).status_code == 204
            for admin in admins:
                assert httpx.get(admin + retention, timeout=10).json() == policy
                assert httpx.get(admin + quotas, timeout=10).json() == {
                    "destination_storage": {
                        "limit": 1000,
                        "limitSize": 1000,
                        "limitTime": -1,
                        "policy": "producer_exception",
                    }
                }
            assert http.get(quotas).json()["destination_storage"]["limitSize"] == 1000
            refused = http.post(retention, json={"retentionTimeInMinutes": -5})
            assert refused.status_code == 400, refused.text
            assert http.delete(retention).status_code == 204
            assert http.delete(quota).status_code == 204
            for admin in admins:
                assert httpx.get(admin + retention, timeout=10).json()["retentionSizeInMB"] == 256
                assert httpx.get(admin + quotas, timeout=10).json() == {}
    finally:
        for broker in brokers:
            if broker.running:
                broker.stop()
            broker.close()


def test_without_admin_url_the_proxy_has_no_namespace_policies(tmp_path: Path) -> None:
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    broker = broker_process(tmp_path / "broker")
    broker.start()
    try:
        with proxy(broker.service_url, None, namespace) as (_, http):
            assert http.get(RETENTION.format(namespace=namespace)).status_code == 404
    finally:
        broker.stop()
        broker.close()
