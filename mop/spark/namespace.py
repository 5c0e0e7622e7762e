"""List the topics of a namespace over the Pulsar binary protocol (GET_TOPICS_OF_NAMESPACE).

pulsar-client sends this command only for its own regex subscriptions and has no call that
returns the list, so the data source asks for it on a short link of its own
(`mop.protocols.pulsar.client`), with the data source's credentials and broker trust. Any
Pulsar-protocol broker answers it (a mop node or Apache Pulsar).
"""

from __future__ import annotations

import trio

from mop.protocols.pulsar import client
from mop.protocols.pulsar.client import ClientAuth, LinkFailed, PulsarLink, service_addresses
from mop.protocols.pulsar.commands import TopicsMode
from mop.spark.options import NO_SECURITY, ClientSecurity
from mop.spark.security import link_auth

__all__ = ["NamespaceListingError", "list_topics"]


class NamespaceListingError(RuntimeError):
    """No broker of the service URL answered the listing (or it refused it)."""


def list_topics(
    service_url: str,
    namespace: str,
    *,
    timeout: float = 30.0,
    security: ClientSecurity = NO_SECURITY,
) -> list[str]:
    """Every topic of `namespace` ("tenant/namespace"), persistent and not, partitions named
    one by one. Tries each host of the service URL in turn, each within `timeout` seconds."""
    try:
        addresses, tls = service_addresses(service_url)
    except ValueError as exc:
        raise NamespaceListingError(str(exc)) from None
    auth = link_auth(security)
    failures: list[str] = []
    for host, port in addresses:
        # Spark calls this from plain threads: a short trio run of its own for each try.
        try:
            return trio.run(_ask_within, host, port, tls, auth, namespace, timeout)
        except LinkFailed as exc:
            failures.append(f"{host}:{port}: {exc}")
        except trio.TooSlowError:
            failures.append(f"{host}:{port}: no answer in time")
    raise NamespaceListingError(
        f"cannot list the topics of {namespace!r} at {service_url}: {'; '.join(failures)}"
    )


async def _ask_within(
    host: str, port: int, tls: bool, auth: ClientAuth, namespace: str, seconds: float
) -> list[str]:
    with trio.fail_after(seconds):
        link = await PulsarLink.connect(host, port, "mop-spark", tls=tls, auth=auth)
        try:
            return await client.list_topics(link, namespace, TopicsMode.ALL)
        finally:
            await link.aclose()
