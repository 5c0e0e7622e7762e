"""The topic routes of the admin API (`/api/v1/topics`) and Pulsar's admin REST API on a broker
(`/admin/v2/...`), served by the ASGI app over a merged node's backend, with no network."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from mop.admin import AdminContext, build_admin_app
from mop.backends.local import LocalBackend, open_local_backend
from mop.broker.storage import MemoryStorage
from mop.membership import Membership
from mop.message import Message
from mop.messaging import SubscriptionKind, SubscriptionSpec
from mop.observability import open_telemetry
from mop.processor import MessagingProcessor
from mop.settings import Settings, TelemetrySettings
from mop.topic_names import mqtt_to_pulsar

SELF = "pulsar://127.0.0.1:6650"
PEER = "pulsar://127.0.0.1:6651"


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with open_local_backend(MemoryStorage()) as running:
        yield running


def client_for(backend: LocalBackend, broker: Membership | None = None) -> httpx.AsyncClient:
    telemetry = open_telemetry(TelemetrySettings(), mode="merged", node_name="test")
    context = AdminContext(
        settings=Settings(),
        processor=MessagingProcessor(backend),
        telemetry=telemetry,
        protocols={},
        listeners=tuple,
        not_ready=backend.not_ready,
        broker=broker,
    )
    transport = httpx.ASGITransport(app=build_admin_app(context))
    # A host the default (loopback) listener answers for.
    return httpx.AsyncClient(transport=transport, base_url="http://localhost")


@pytest.fixture
async def api(backend: LocalBackend) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(backend, Membership((), SELF)) as client:
        yield client


async def publish(backend: LocalBackend, topic: str, *payloads: bytes) -> None:
    for payload in payloads:
        await backend.publish(mqtt_to_pulsar(topic), Message(payload))


async def test_list_pages_and_filters_by_prefix(
    backend: LocalBackend, api: httpx.AsyncClient
) -> None:
    for name in ("a/1", "a/2", "b/1"):
        await publish(backend, name, b"xy")
    page = (await api.get("/api/v1/topics", params={"prefix": "a/", "limit": 1})).json()
    assert page["total"] == 2 and page["offset"] == 0 and page["limit"] == 1
    assert page["items"] == [
        {
            "topic": "a/1",
            "pulsar_topic": "persistent://public/default/a%2F1",
            "messages_in": 1,
            "bytes_in": 2,
            "storage_size": 2,
            "subscriptions": 0,
            "backlog": 0,
        }
    ]
    second = (await api.get("/api/v1/topics?prefix=a/&offset=1&limit=1")).json()
    assert [item["topic"] for item in second["items"]] == ["a/2"]
    assert (await api.get("/api/v1/topics?limit=1001")).status_code == 400
    # As every page of the API (and openapi.yaml) has it: limit 0 counts without listing.
    counted = (await api.get("/api/v1/topics?prefix=a/&limit=0")).json()
    assert (counted["items"], counted["total"], counted["limit"]) == ([], 2, 0)


async def test_one_topic_with_its_subscriptions(
    backend: LocalBackend, api: httpx.AsyncClient
) -> None:
    spec = SubscriptionSpec("sub", frozenset({"t/x"}), kind=SubscriptionKind.SHARED)
    consumer = await backend.subscribe(spec)
    await publish(backend, "t/x", b"1", b"22", b"333")
    taken = await consumer.receive(1)
    answer = await api.get("/api/v1/topics/t%2Fx")
    assert answer.status_code == 200
    detail = answer.json()
    assert detail["messages_in"] == 3 and detail["bytes_in"] == 6 and detail["backlog"] == 3
    assert detail["subscriptions_detail"] == [
        {"name": "sub", "type": "shared", "backlog": 3, "consumers": 1}
    ]
    consumer.ack(taken)
    by_full_name = await api.get("/api/v1/topics/persistent%3A%2F%2Fpublic%2Fdefault%2Ft%252Fx")
    assert by_full_name.json()["backlog"] == 2
    assert (await api.get("/api/v1/topics/nope")).status_code == 404
    assert (await api.get("/api/v1/topics/a%2F%2B")).status_code == 400
    await consumer.close()


async def test_delete_is_refused_while_a_consumer_is_attached(
    backend: LocalBackend, api: httpx.AsyncClient
) -> None:
    consumer = await backend.subscribe(SubscriptionSpec("sub", frozenset({"d"})))
    await publish(backend, "d", b"1")
    refused = await api.delete("/api/v1/topics/d")
    assert refused.status_code == 409 and "consumer" in refused.json()["error"]
    assert (await api.delete("/api/v1/topics/d?force=maybe")).status_code == 400
    await consumer.close()
    assert (await api.delete("/api/v1/topics/d")).status_code == 204
    assert (await api.get("/api/v1/topics/d")).status_code == 404
    assert (await api.delete("/api/v1/topics/d")).status_code == 404
    system = "/api/v1/topics/persistent%3A%2F%2Fpublic%2F__mop%2Fdefault%252Ftable%252Fx"
    assert (await api.delete(system)).status_code == 403


async def test_force_deletes_a_topic_in_use(backend: LocalBackend, api: httpx.AsyncClient) -> None:
    consumer = await backend.subscribe(SubscriptionSpec("sub", frozenset({"f"})))
    await publish(backend, "f", b"1")
    assert (await api.delete("/api/v1/topics/f?force=true")).status_code == 204
    assert (await api.get("/api/v1/topics/f")).status_code == 404
    await consumer.close()


async def test_pulsar_admin_routes_speak_pulsars_names(
    backend: LocalBackend, api: httpx.AsyncClient
) -> None:
    consumer = await backend.subscribe(
        SubscriptionSpec("s1", frozenset({"p/q"}), kind=SubscriptionKind.FAILOVER)
    )
    await publish(backend, "p/q", b"abc", b"de")
    listing = await api.get("/admin/v2/persistent/public/default")
    assert listing.json() == ["persistent://public/default/p%2Fq"]
    stats = (await api.get("/admin/v2/persistent/public/default/p%252Fq/stats")).json()
    assert stats["msgInCounter"] == 2 and stats["bytesInCounter"] == 5
    assert stats["storageSize"] == 5 and stats["publishers"] == []
    for name in ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut"):
        assert isinstance(stats[name], float)
    sub = stats["subscriptions"]["s1"]
    assert sub["type"] == "Failover" and sub["msgBacklog"] == 2
    assert [c["consumerName"] for c in sub["consumers"]] == [""]
    busy = await api.delete("/admin/v2/persistent/public/default/p%252Fq")
    assert busy.status_code == 412 and "reason" in busy.json()
    missing = await api.get("/admin/v2/persistent/public/default/none/stats")
    assert missing.status_code == 404 and missing.json() == {"reason": "Topic not found"}
    await consumer.close()
    assert (await api.delete("/admin/v2/persistent/public/default/p%252Fq")).status_code == 204
    assert (await api.get("/admin/v2/persistent/public/default")).json() == []


async def test_pulsar_admin_routes_refuse_names_and_flags_that_are_not_valid(
    api: httpx.AsyncClient,
) -> None:
    # As Pulsar's brokers answer a name that is not valid: 412, Pulsar's error document.
    for path in ("/admin/v2/persistent/public/d%C3%A9faut", "/admin/v2/persistent/a b/ns/t/stats"):
        answer = await api.get(path)
        assert answer.status_code == 412 and "reason" in answer.json(), path
    for force in ("", "yes", "1"):
        answer = await api.delete(f"/admin/v2/persistent/public/default/t?force={force}")
        assert answer.status_code == 400, force
        assert answer.json() == {"reason": "force must be true or false"}
    gone = await api.delete("/admin/v2/persistent/public/default/t?force=TRUE")
    assert gone.status_code == 404


async def test_a_cluster_member_sends_the_proxy_on_for_a_topic_it_does_not_own(
    backend: LocalBackend,
) -> None:
    membership = Membership((SELF, PEER), SELF)
    theirs = next(n for n in range(100) if not membership.owns(f"persistent://public/default/t{n}"))
    async with client_for(backend, membership) as api:
        answer = await api.get(f"/admin/v2/persistent/public/default/t{theirs}/stats")
    assert answer.status_code == 421 and PEER in answer.json()["reason"]


async def test_a_node_that_is_no_broker_has_no_pulsar_routes(backend: LocalBackend) -> None:
    async with client_for(backend, None) as api:
        assert (await api.get("/admin/v2/persistent/public/default")).status_code == 404


async def test_readyz_follows_the_backend(backend: LocalBackend, api: httpx.AsyncClient) -> None:
    assert (await api.get("/readyz")).status_code == 200
    await backend.aclose()
    answer = await api.get("/readyz")
    assert answer.status_code == 503 and answer.json()["problems"] == ["the broker is closed"]
