"""A proxy's topic questions to the brokers' HTTP admin (`BrokerAdmin`), against stand-in
brokers (httpx's MockTransport): which URL answers, how redirects, refusals, a topic in use and
unreachable brokers come out, and which credentials go along."""

from __future__ import annotations

import base64
from collections.abc import Callable
from functools import partial

import httpx
import pytest
import trio

from mop.backends.cluster.topic_admin import BrokerAdmin, admin_urls
from mop.messaging import BackendError, TopicBusy
from mop.protocols.pulsar.client import ClientAuth
from mop.schemas import Compatibility

TOPIC = "persistent://public/default/a%2Fb"
STATS_PATH = "/admin/v2/persistent/public/default/a%252Fb/stats"
STATS = {"msgInCounter": 3, "bytesInCounter": 30, "storageSize": 99, "subscriptions": {}}

Broker = Callable[[httpx.Request], httpx.Response]


def admin(routes: dict[str, Broker], urls: str, auth: ClientAuth | None = None) -> BrokerAdmin:
    """A BrokerAdmin whose requests go to `routes[host]` (any other host refuses them)."""

    def handle(request: httpx.Request) -> httpx.Response:
        answer = routes.get(request.url.host)
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        return answer(request)

    return BrokerAdmin(
        admin_urls(urls), auth=auth or ClientAuth(), transport=httpx.MockTransport(handle)
    )


def not_owner(request: httpx.Request) -> httpx.Response:
    return httpx.Response(421, json={"reason": "owned by another member"})


def owner(request: httpx.Request) -> httpx.Response:
    assert request.url.raw_path.decode() == STATS_PATH
    return httpx.Response(200, json=STATS)


def test_admin_urls_take_pulsars_short_form() -> None:
    assert admin_urls("http://b1:8080/") == ("http://b1:8080",)
    assert admin_urls("https://b1:8443,b2:8443") == ("https://b1:8443", "https://b2:8443")
    assert admin_urls("http://b1:1, http://b2:2") == ("http://b1:1", "http://b2:2")
    for wrong in ("b1:8080", "pulsar://b1:6650", "http://b1:1,,b2", "http://b1:1,ftp://b2"):
        with pytest.raises(ValueError):
            admin_urls(wrong)


async def test_the_owner_answers_after_the_others_send_the_proxy_on() -> None:
    brokers = admin({"b1": not_owner, "b2": owner}, "http://b1:1,http://b2:2")
    stats = await brokers.stats(TOPIC)
    assert stats is not None and stats.inbound.messages == 3 and stats.storage_size == 99
    await brokers.aclose()


async def test_a_redirect_is_followed() -> None:
    def any_broker(request: httpx.Request) -> httpx.Response:
        return httpx.Response(307, headers={"location": f"http://b2:2{STATS_PATH}"})

    brokers = admin({"b1": any_broker, "b2": owner}, "http://b1:1")
    assert await brokers.stats(TOPIC) is not None
    await brokers.aclose()


async def test_missing_busy_and_deleted() -> None:
    seen: list[str] = []

    def broker(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.raw_path.decode()}")
        if request.method == "GET":
            return httpx.Response(404, json={"reason": "Topic not found"})
        if request.url.params.get("force") != "true":
            return httpx.Response(412, json={"reason": "Topic has active producers/subscriptions"})
        return httpx.Response(204)

    brokers = admin({"b1": broker}, "http://b1:1")
    assert await brokers.stats(TOPIC) is None
    with pytest.raises(TopicBusy, match="active producers"):
        await brokers.delete(TOPIC)
    assert await brokers.delete(TOPIC, force=True)
    assert seen[-1] == "DELETE /admin/v2/persistent/public/default/a%252Fb?force=true"
    await brokers.aclose()


async def test_unreachable_brokers_and_no_owner_are_unavailable() -> None:
    down = admin({"b1": not_owner}, "http://b1:1,http://b2:2")
    with pytest.raises(BackendError, match="b2:2") as raised:
        await down.stats(TOPIC)
    assert raised.value.reason == "unavailable"
    await down.aclose()
    nobody = admin({"b1": not_owner}, "http://b1:1")
    with pytest.raises(BackendError, match=r"no broker of cluster\.admin_url owns"):
        await nobody.stats(TOPIC)
    await nobody.aclose()


async def test_the_proxys_credentials_go_along() -> None:
    headers: list[str | None] = []

    def broker(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers.get("authorization"))
        return httpx.Response(401, json={"reason": "no"})

    token = admin({"b1": broker}, "http://b1:1", ClientAuth("token", b"jwt"))
    with pytest.raises(BackendError, match=r"cluster\.auth") as raised:
        await token.stats(TOPIC)
    assert raised.value.reason == "not_authorized"
    await token.aclose()
    basic = admin({"b1": broker}, "http://b1:1", ClientAuth("basic", b"u:p"))
    with pytest.raises(BackendError):
        await basic.delete(TOPIC)
    await basic.aclose()
    assert headers == ["Bearer jwt", "Basic " + base64.b64encode(b"u:p").decode()]


async def test_a_garbled_answer_is_an_error() -> None:
    brokers = admin({"b1": lambda r: httpx.Response(200, text="<html>")}, "http://b1:1")
    with pytest.raises(BackendError) as raised:
        await brokers.stats(TOPIC)
    assert raised.value.reason == "bad_answer"
    await brokers.aclose()


async def test_the_proxys_credentials_follow_a_redirect_to_the_owner() -> None:
    """Apache Pulsar's brokers redirect to the topic's owner, which checks the credentials
    too (as Pulsar's own admin client does, they go along)."""
    seen: list[tuple[str, str | None]] = []

    def any_broker(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        return httpx.Response(307, headers={"location": f"http://b2:2{STATS_PATH}"})

    def secured_owner(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        if request.headers.get("authorization") != "Bearer jwt":
            return httpx.Response(401, json={"reason": "authentication required"})
        return owner(request)

    brokers = admin(
        {"b1": any_broker, "b2": secured_owner}, "http://b1:1", ClientAuth("token", b"jwt")
    )
    assert await brokers.stats(TOPIC) is not None
    assert seen == [("b1", "Bearer jwt"), ("b2", "Bearer jwt")]
    await brokers.aclose()


async def test_credentials_do_not_follow_a_redirect_from_https_to_http() -> None:
    seen: list[str | None] = []

    def any_broker(request: httpx.Request) -> httpx.Response:
        return httpx.Response(307, headers={"location": f"http://b2:2{STATS_PATH}"})

    def plain_owner(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(401, json={"reason": "authentication required"})

    brokers = admin(
        {"b1": any_broker, "b2": plain_owner}, "https://b1:1", ClientAuth("token", b"jwt")
    )
    with pytest.raises(BackendError):
        await brokers.stats(TOPIC)
    assert seen == [None]
    await brokers.aclose()


async def test_a_redirect_loop_is_an_error() -> None:
    def looping(request: httpx.Request) -> httpx.Response:
        return httpx.Response(307, headers={"location": f"http://b1:1{STATS_PATH}"})

    brokers = admin({"b1": looping}, "http://b1:1")
    with pytest.raises(BackendError) as raised:
        await brokers.stats(TOPIC)
    assert raised.value.reason == "unavailable"
    await brokers.aclose()


async def trickle(stream: trio.SocketStream) -> None:
    """A broker that answers at once and then sends its body a byte at a time: every read
    gets something well within any read timeout, the whole answer never ends in time."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10000\r\n\r\n"
    async with stream:
        await stream.receive_some(65536)
        try:
            await stream.send_all(head)
            for _ in range(10000):
                await stream.send_all(b" ")
                await trio.sleep(0.05)
        except trio.BrokenResourceError:
            pass  # the proxy gave up


async def test_a_broker_that_trickles_its_answer_takes_at_most_the_timeout() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, trickle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        brokers = BrokerAdmin(admin_urls(f"{url},{url}"), timeout=0.3)
        started = trio.current_time()
        with trio.fail_after(5), pytest.raises(BackendError, match=r"no answer within 0\.3 s"):
            await brokers.stats(TOPIC)
        # Each URL had its 0.3 s, no more.
        assert trio.current_time() - started < 1.5
        await brokers.aclose()
        nursery.cancel_scope.cancel()


async def test_a_refusal_of_the_host_comes_out_when_no_broker_owns_the_topic() -> None:
    def misdirected(request: httpx.Request) -> httpx.Response:
        return httpx.Response(421, json={"error": "refused: this node does not answer for b1"})

    brokers = admin({"b1": misdirected}, "http://b1:1")
    with pytest.raises(BackendError, match="does not answer for b1"):
        await brokers.stats(TOPIC)
    await brokers.aclose()


STRATEGY_PATH = "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy"


async def test_a_namespace_rule_is_read_from_one_broker_and_set_on_every_one() -> None:
    kept: dict[str, str] = {}

    def broker(name: str, request: httpx.Request) -> httpx.Response:
        assert request.url.raw_path.decode() == STRATEGY_PATH
        if request.method == "PUT":
            assert request.headers["content-type"] == "application/json"
            kept[name] = request.content.decode()
            return httpx.Response(204)
        return httpx.Response(200, json=kept.get(name, "UNDEFINED").strip('"'))

    brokers = admin(
        {"b1": partial(broker, "b1"), "b2": partial(broker, "b2")}, "http://b1:1,http://b2:2"
    )
    # A namespace without a rule of its own: the brokers apply FULL (Pulsar's default).
    assert await brokers.schema_compatibility("public/default") is Compatibility.FULL
    await brokers.set_schema_compatibility("public/default", Compatibility.BACKWARD)
    assert kept == {"b1": '"BACKWARD"', "b2": '"BACKWARD"'}
    assert await brokers.schema_compatibility("public/default") is Compatibility.BACKWARD
    await brokers.set_schema_compatibility("public/default", None)
    assert kept == {"b1": '"UNDEFINED"', "b2": '"UNDEFINED"'}
    with pytest.raises(BackendError, match="tenant/namespace"):
        await brokers.schema_compatibility("no-namespace")
    await brokers.aclose()


async def test_a_rule_that_is_not_one_is_a_bad_answer() -> None:
    def odd(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json="SOMETIMES")

    brokers = admin({"b1": odd}, "http://b1:1")
    with pytest.raises(BackendError) as refused:
        await brokers.schema_compatibility("public/default")
    assert refused.value.reason == "bad_answer"
    await brokers.aclose()
