"""The two questions pulsar-client for Python cannot be asked: which topics a namespace has
(GET_TOPICS_OF_NAMESPACE) and which broker owns a topic (LOOKUP, following redirects).

Each call opens a short link of its own (`mop.protocols.pulsar.link`) to the first broker of the
service URL that answers.
"""

from __future__ import annotations

from typing import Final

import trio

from mop.processor.backend import BackendError
from mop.protocols.pulsar.commands import (
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Lookup,
    LookupResponse,
    LookupType,
    TopicsMode,
)
from mop.protocols.pulsar.link import LinkFailed, PulsarLink, service_addresses

__all__ = ["get_topics", "lookup"]

_CLIENT_VERSION: Final = "mop-cluster"
_MAX_REDIRECTS: Final = 8


def _error(what: str, exc: LinkFailed) -> BackendError:
    # A broker that answered with an ERROR said no; anything else means it is not there.
    if exc.error is not None:
        return BackendError(f"{what}: {exc}")
    return BackendError(f"{what}: {exc}", reason="unavailable")


async def _connect(service_url: str, seconds: float) -> PulsarLink:
    """A link to the first broker of `service_url` that completes the handshake."""
    try:
        addresses, tls = service_addresses(service_url)
    except ValueError as exc:
        raise BackendError(str(exc), reason="invalid_url") from None
    failures = []
    with trio.move_on_after(seconds):
        for host, port in addresses:
            try:
                return await PulsarLink.connect(host, port, _CLIENT_VERSION, tls=tls)
            except LinkFailed as exc:
                failures.append(str(exc))
        raise BackendError(
            f"no broker of {service_url} answers: {'; '.join(failures)}", reason="unavailable"
        )
    raise BackendError(f"{service_url}: no answer in {seconds}s", reason="unavailable")


async def get_topics(service_url: str, namespace: str, *, seconds: float = 10.0) -> list[str]:
    """Every topic of `namespace` ("tenant/namespace"), persistent or not, asked within
    `seconds`."""
    link = await _connect(service_url, seconds)
    what = f"topics of {namespace}"
    try:
        with trio.fail_after(seconds):
            reply = await link.ask(
                GetTopicsOfNamespace(
                    request_id=link.request_id(), namespace=namespace, mode=TopicsMode.ALL
                )
            )
    except trio.TooSlowError:
        raise BackendError(f"{what}: no answer", reason="unavailable") from None
    except LinkFailed as exc:
        raise _error(what, exc) from None
    finally:
        await link.aclose()
    if not isinstance(reply, GetTopicsOfNamespaceResponse):
        raise BackendError(f"{what}: unexpected answer {reply!r:.200}")
    return sorted(reply.topics)


async def lookup(service_url: str, topic: str, *, seconds: float = 10.0) -> str:
    """The service URL of the broker that owns `topic`, following redirects, within
    `seconds`."""
    url = service_url
    authoritative = False
    what = f"lookup of {topic}"
    with trio.move_on_after(seconds) as scope:
        for _ in range(_MAX_REDIRECTS):
            link = await _connect(url, seconds)
            try:
                reply = await link.ask(
                    Lookup(topic=topic, request_id=link.request_id(), authoritative=authoritative)
                )
            except LinkFailed as exc:
                raise _error(what, exc) from None
            finally:
                await link.aclose()
            if not isinstance(reply, LookupResponse) or reply.response is LookupType.Failed:
                raise BackendError(f"{what} failed: {reply!r:.200}")
            if not reply.broker_service_url:
                raise BackendError(f"{what}: no broker URL in {reply!r:.200}")
            if reply.response is LookupType.Connect:
                return reply.broker_service_url
            url, authoritative = reply.broker_service_url, reply.authoritative
        raise BackendError(f"{what}: more than {_MAX_REDIRECTS} redirects")
    assert scope.cancelled_caught
    raise BackendError(f"{what}: no answer in {seconds}s", reason="unavailable")
