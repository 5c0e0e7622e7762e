"""The two questions pulsar-client for Python cannot be asked: which topics a namespace has
(GET_TOPICS_OF_NAMESPACE) and which broker owns a topic (LOOKUP, following redirects).

The protocol is spoken by `mop.protocols.pulsar.client`; this module gives its answers and
failures the terms of a backend. Each call opens a short link of its own to the first broker of
the service URL that answers; a `TopicLister`, which lists one namespace again and again (the topic
poller of `discovery`), keeps its link between calls instead.
"""

from __future__ import annotations

from typing import Final

import trio

from mop.processor.backend import BackendError
from mop.protocols.pulsar import client
from mop.protocols.pulsar.client import (
    NO_AUTH,
    ClientAuth,
    LinkFailed,
    LookupFailed,
    PulsarLink,
    UnexpectedAnswer,
    Unreachable,
)
from mop.protocols.pulsar.commands import TopicsMode

__all__ = ["TopicLister", "get_topics", "lookup"]

_CLIENT_VERSION: Final = "mop-cluster"


def _error(what: str, exc: LinkFailed) -> BackendError:
    # A broker that answered with an ERROR said no; anything else means it is not there.
    if exc.error is not None:
        return BackendError(f"{what}: {exc}")
    return BackendError(f"{what}: {exc}", reason="unavailable")


async def _connect(service_url: str, seconds: float, auth: ClientAuth) -> PulsarLink:
    """A link to the first broker of `service_url` that completes the handshake."""
    with trio.move_on_after(seconds):
        try:
            return await client.connect_first(service_url, _CLIENT_VERSION, auth=auth)
        except ValueError as exc:
            raise BackendError(str(exc), reason="invalid_url") from None
        except Unreachable as exc:
            raise BackendError(str(exc), reason="unavailable") from None
    raise BackendError(f"{service_url}: no answer in {seconds}s", reason="unavailable")


async def _ask_topics(
    link: PulsarLink, namespace: str, mode: TopicsMode, seconds: float
) -> list[str]:
    """The topics of `namespace` asked over `link`; LinkFailed when the link breaks."""
    what = f"topics of {namespace}"
    try:
        with trio.fail_after(seconds):
            topics = await client.list_topics(link, namespace, mode)
    except trio.TooSlowError:
        # A broker that does not implement the command may ignore it rather than refuse it.
        raise BackendError(
            f"{what}: no answer in {seconds}s (does the broker support GetTopicsOfNamespace?)",
            reason="unavailable",
        ) from None
    except UnexpectedAnswer as exc:
        raise BackendError(f"{what}: {exc}") from None
    except LinkFailed as exc:
        if exc.error is not None:
            raise _error(what, exc) from None
        raise
    return sorted(topics)


async def get_topics(
    service_url: str, namespace: str, *, seconds: float = 10.0, auth: ClientAuth = NO_AUTH
) -> list[str]:
    """Every topic of `namespace` ("tenant/namespace"), persistent or not, asked within
    `seconds`."""
    link = await _connect(service_url, seconds, auth)
    try:
        return await _ask_topics(link, namespace, TopicsMode.ALL, seconds)
    except LinkFailed as exc:
        raise _error(f"topics of {namespace}", exc) from None
    finally:
        await link.aclose()


class TopicLister:
    """Lists the persistent topics of namespaces over one link kept between calls (opened on
    first use, opened again after it breaks); one call at a time."""

    def __init__(
        self, service_url: str, *, seconds: float = 10.0, auth: ClientAuth = NO_AUTH
    ) -> None:
        self.service_url = service_url
        self.seconds = seconds
        self.auth = auth
        self._link: PulsarLink | None = None
        self._lock = trio.Lock()

    async def topics(self, namespace: str) -> list[str]:
        async with self._lock:
            # A kept link may have been closed by the broker meanwhile: one fresh try then.
            while True:
                fresh = self._link is None
                if self._link is None:
                    self._link = await _connect(self.service_url, self.seconds, self.auth)
                try:
                    return await _ask_topics(
                        self._link, namespace, TopicsMode.PERSISTENT, self.seconds
                    )
                except LinkFailed as exc:
                    await self.aclose()
                    if fresh:
                        raise _error(f"topics of {namespace}", exc) from None
                except BackendError:
                    await self.aclose()  # a late answer must not be taken for the next one
                    raise

    async def aclose(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            with trio.CancelScope(shield=True):
                await link.aclose()


async def lookup(
    service_url: str, topic: str, *, seconds: float = 10.0, auth: ClientAuth = NO_AUTH
) -> str:
    """The service URL of the broker that owns `topic`, following redirects, within
    `seconds`."""
    what = f"lookup of {topic}"
    with trio.move_on_after(seconds) as scope:
        try:
            return await client.lookup(service_url, topic, _CLIENT_VERSION, auth=auth)
        except ValueError as exc:
            raise BackendError(str(exc), reason="invalid_url") from None
        except Unreachable as exc:
            raise BackendError(str(exc), reason="unavailable") from None
        except LookupFailed as exc:
            raise BackendError(str(exc)) from None
        except LinkFailed as exc:
            raise _error(what, exc) from None
    assert scope.cancelled_caught
    raise BackendError(f"{what}: no answer in {seconds}s", reason="unavailable")
