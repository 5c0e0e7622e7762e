"""Topics in a separated proxy's admin API: the proxy asks the brokers' HTTP admin
(`cluster.admin_url`, Pulsar's admin REST API) for a topic's stats and to delete it, with one mop
broker and with a cluster of two (where the non-owner sends the proxy on); without the setting it
says which setting is missing. `/readyz` turns 503 while the brokers cannot be reached and 200
again once they are back."""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from mop.membership import Membership
from mop.settings import Settings
from mop.testing.node import RunningNode, as_proxy, node_settings, running_node
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.admin.topics_support import admin_url, eventually, stats, topic_url
from tests.e2e.clients import Client
from tests.e2e.cluster.support import two_brokers
from tests.e2e.nodeproc import NodeProcess, broker_process
from tests.e2e.pulsar.test_broker_cluster import free_ports

pytestmark = pytest.mark.e2e

ADMIN_LISTENING = re.compile(r"admin listening on tcp (?P<host>\S+):(?P<port>\d+)")


def broker_admin(broker: NodeProcess) -> str:
    """The admin URL of a running broker process (from its log)."""
    found = broker.find(ADMIN_LISTENING) or [broker.wait_for(ADMIN_LISTENING, 10)]
    return f"http://127.0.0.1:{found[-1]['port']}"


def proxy_settings(service_url: str, admin: str | None, namespace: str) -> Settings:
    settings = as_proxy(node_settings(), service_url, namespace=namespace)
    return dataclasses.replace(
        settings, cluster=dataclasses.replace(settings.cluster, admin_url=admin)
    )


@contextmanager
def proxy(
    service_url: str, admin: str | None, namespace: str
) -> Iterator[tuple[RunningNode, httpx.Client]]:
    with (
        running_node(proxy_settings(service_url, admin, namespace)) as node,
        httpx.Client(base_url=admin_url(node), timeout=30) as http,
    ):
        yield node, http


@pytest.fixture
def namespace() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def test_stats_and_delete_through_the_proxy(broker: NodeProcess, namespace: str) -> None:
    with proxy(broker.service_url, broker_admin(broker), namespace) as (node, http):
        reader = Client(
            node.mqtt_port, f"{namespace}-reader", version=4, clean=False, manual_ack=True
        )
        assert reader.subscribe("plant/temp", qos=1) == [1]
        writer = Client(node.mqtt_port, f"{namespace}-writer")
        for n in range(4):
            assert writer.publish("plant/temp", f"{20 + n}C".encode(), qos=1) == 0
        reader.expect(4)  # never acknowledged
        detail = eventually(
            lambda: stats(http, "plant/temp"),
            lambda d: d.get("messages_in") == 4 and d.get("backlog") == 4,
        )
        assert detail["pulsar_topic"] == mqtt_to_pulsar("plant/temp", namespace=namespace)
        assert detail["bytes_in"] == 12 and detail["storage_size"] > 0
        [sub] = detail["subscriptions_detail"]
        assert sub["backlog"] == 4 and sub["consumers"] == 1
        listed = http.get("/api/v1/topics", params={"prefix": "plant/"}).json()
        assert [(i["topic"], i["messages_in"]) for i in listed["items"]] == [("plant/temp", 4)]
        refused = http.delete(topic_url("plant/temp"))
        assert refused.status_code == 409, refused.text
        reader.disconnect()
        deleted = eventually(
            lambda: http.delete(topic_url("plant/temp")).status_code, lambda s: s == 204
        )
        assert deleted == 204
        assert http.get(topic_url("plant/temp")).status_code == 404


def test_without_admin_url_the_proxy_names_the_setting(broker: NodeProcess, namespace: str) -> None:
    with proxy(broker.service_url, None, namespace) as (node, http):
        writer = Client(node.mqtt_port, f"{namespace}-writer")
        assert writer.publish("plain/topic", b"x", qos=1) == 0
        answer = http.get(topic_url("plain/topic"))
        assert answer.status_code == 501 and "cluster.admin_url" in answer.json()["error"]
        assert http.delete(topic_url("plain/topic")).status_code == 501
        listed = eventually(
            lambda: http.get("/api/v1/topics").json(), lambda page: page["total"] == 1
        )
        assert listed["items"][0]["topic"] == "plain/topic"
        assert listed["items"][0]["messages_in"] is None


def test_readyz_follows_the_brokers(tmp_path: Path, namespace: str) -> None:
    pulsar_port, admin_port = free_ports(2)
    broker = broker_process(
        tmp_path / "broker", MOP_PULSAR__PORT=str(pulsar_port), MOP_ADMIN__PORT=str(admin_port)
    )
    broker.start()
    try:
        with proxy(broker.service_url, f"http://127.0.0.1:{admin_port}", namespace) as (_, http):
            assert http.get("/readyz").status_code == 200
            assert broker.stop() == 0
            down = eventually(lambda: http.get("/readyz"), lambda a: a.status_code == 503)
            assert down.status_code == 503
            [problem] = down.json()["problems"]
            assert f"127.0.0.1:{pulsar_port}" in problem and "cannot be reached" in problem
            assert http.get(topic_url("any")).status_code == 503
            broker.start()
            back = eventually(lambda: http.get("/readyz"), lambda a: a.status_code == 200)
            assert back.status_code == 200
    finally:
        broker.close()


def test_a_cluster_of_two_brokers_through_the_proxy(tmp_path: Path, namespace: str) -> None:
    urls, admins, brokers = two_brokers(tmp_path)
    ownership = Membership(urls, urls[0])
    # A topic of each broker (which one owns a name depends on the ports of this run).
    topics: dict[str, str] = {}
    for n in range(1000):
        name = f"zone/{n}"
        topics.setdefault(ownership.owner(mqtt_to_pulsar(name, namespace=namespace)), name)
        if len(topics) == 2:
            break
    try:
        for broker in brokers:
            broker.start()
        service_url = "pulsar://" + ",".join(url.removeprefix("pulsar://") for url in urls)
        with proxy(service_url, ",".join(admins), namespace) as (node, http):
            writer = Client(node.mqtt_port, f"{namespace}-writer")
            for count, name in enumerate(topics.values(), start=1):
                for _ in range(count):
                    assert writer.publish(name, b"reading", qos=1) == 0
            for count, (owner, name) in enumerate(topics.items(), start=1):
                detail = eventually(
                    lambda name=name: stats(http, name),  # type: ignore[misc]
                    lambda d, count=count: d.get("messages_in") == count,  # type: ignore[misc]
                )
                assert detail["messages_in"] == count, (owner, detail)
                # The other member sends a proxy on, naming the owner.
                other = admins[1 - urls.index(owner)]
                local = mqtt_to_pulsar(name, namespace=namespace).rpartition("/")[2]
                path = f"/admin/v2/persistent/public/{namespace}/{local.replace('%', '%25')}"
                misdirected = httpx.get(other + path + "/stats", timeout=10)
                assert misdirected.status_code == 421 and owner in misdirected.json()["reason"]
                assert http.delete(topic_url(name)).status_code == 204
                assert http.get(topic_url(name)).status_code == 404
    finally:
        for broker in brokers:
            if broker.running:
                broker.stop()
            broker.close()
