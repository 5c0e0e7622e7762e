"""List the topics of a namespace over the Pulsar binary protocol (GET_TOPICS_OF_NAMESPACE).

pulsar-client sends this command only for its own regex subscriptions and has no call that
returns the list, so the data source asks for it on a short link of its own
(`mop.protocols.pulsar.client`). Any Pulsar-protocol broker answers it (a mop node or Apache
Pulsar); it needs no authentication, which is what such a broker allows by default.
"""

from __future__ import annotations

import trio

from mop.protocols.pulsar import client
from mop.protocols.pulsar.client import LinkFailed, PulsarLink, service_addresses
from mop.protocols.pulsar.commands import TopicsMode

__all__ = ["NamespaceListingError", "list_topics"]


class NamespaceListingError(RuntimeError):
    """No broker of the service URL answered the listing (or it refused it)."""


def list_topics(service_url: str, namespace: str, *, timeout: float = 30.0) -> list[str]:
    """Every topic of `namespace` ("tenant/namespace"), persistent and not, partitions named
    one by one. Tries each host of the service URL in turn, each within `timeout` seconds."""
    try:
        addresses, tls = service_addresses(service_url)
    except ValueError as exc:
        raise NamespaceListingError(str(exc)) from None
    failures: list[str] = []
    for host, port in addresses:
        # Spark calls this from plain threads: a short trio run of its own for each try.
        try:
            return trio.run(_ask_within, host, port, tls, namespace, timeout)
        except LinkFailed as exc:
            failures.append(f"{host}:{port}: {exc}")
        except trio.TooSlowError:
            failures.append(f"{host}:{port}: no answer in time")
    raise NamespaceListingError(
        f"cannot list the topics of {namespace!r} at {service_url}: {'; '.join(failures)}"
    )


async def _ask_within(host: str, port: int, tls: bool, namespace: str, seconds: float) -> list[str]:
    with trio.fail_after(seconds):
        link = await PulsarLink.connect(host, port, "mop-spark", tls=tls)
        try:
            return await client.list_topics(link, namespace, TopicsMode.ALL)
        finally:
            await link.aclose()
