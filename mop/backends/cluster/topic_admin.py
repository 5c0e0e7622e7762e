"""Topic questions (stats, delete) that the Pulsar binary protocol cannot ask, put to the brokers'
HTTP admin service in Apache Pulsar's admin REST API v2 (`mop.protocols.pulsar.admin_rest`).

`cluster.admin_url` names one admin URL or several, comma-separated. Each question goes to them
in turn until one answers for the topic:
- Apache Pulsar: any broker answers, redirecting (307) to the topic's owner, which is asked
  with the proxy's credentials too (as Pulsar's own admin client does; never from https to
  http); the next URL is tried only when one cannot be reached.
- mop brokers: the owner answers; another member of the cluster answers 421 Misdirected Request
  (it holds no topic it does not own), and the next URL is asked. One URL for a single broker,
  every member's for a cluster.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any, Final
from urllib.parse import quote

import httpx
import trio

from mop.messaging import BackendError, TopicBusy
from mop.processor.backend import TopicStats
from mop.protocols.pulsar.admin_rest import (
    ADMIN_PREFIX,
    StatsFormatError,
    stats_from_document,
    topic_path,
)
from mop.protocols.pulsar.client import NO_AUTH, ClientAuth
from mop.schemas.model import Compatibility
from mop.topic_names import PulsarTopicName
from mop.topics import TopicError

__all__ = ["BrokerAdmin", "admin_urls", "answer_reason"]

log = logging.getLogger("mop.cluster")

# A mop broker's answer for a topic another member of its cluster owns.
NOT_OWNER: Final = 421
_BUSY: Final = frozenset({409, 412})  # Pulsar answers 412 to a delete of a topic in use
_REFUSED: Final = frozenset({401, 403})
# The refusals of a partitioned topic's metadata (a count refused, one there already, a
# partition in use), read by `mop.backends.cluster.partitioned`.
_PARTITION_REFUSALS: Final = frozenset({400, 406, 409, 412, 422})
_SCHEMES: Final = ("http://", "https://")
# Redirects that keep the method (Pulsar's are 307), followed up to _MAX_REDIRECTS times.
_REDIRECTS: Final = frozenset({301, 302, 307, 308})
_MAX_REDIRECTS: Final = 5


def admin_urls(value: str) -> tuple[str, ...]:
    """The base URLs of `cluster.admin_url`: "http://b1:8080,http://b2:8080", or Pulsar's
    short form "http://b1:8080,b2:8080" (later entries take the first one's scheme).
    ValueError when it is not of that form."""
    parts = [part.strip().rstrip("/") for part in value.split(",")]
    first = parts[0]
    if not first.startswith(_SCHEMES) or not all(parts):
        raise ValueError(f"{value!r} is not a list of http:// or https:// URLs")
    scheme = first.partition("://")[0]
    urls = []
    for part in parts:
        if "://" not in part:
            part = f"{scheme}://{part}"
        elif not part.startswith(_SCHEMES):
            raise ValueError(f"{part!r} is not an http:// or https:// URL")
        urls.append(part)
    return tuple(urls)


def _headers(auth: ClientAuth) -> dict[str, str]:
    """The proxy's credentials (`cluster.auth`) as HTTP authorization, as Pulsar's admin
    client sends them: a token as Bearer, basic as Basic."""
    data = auth.current_data()
    if not data:
        return {}
    if auth.method == "token":
        return {"authorization": f"Bearer {data.decode()}"}
    if auth.method == "basic":
        return {"authorization": f"Basic {base64.b64encode(data).decode()}"}
    return {}


class BrokerAdmin:
    """The brokers' HTTP admin service at `urls` (see the module docstring); one client with
    kept-alive connections, closed by `aclose`. Every question takes at most `timeout`
    seconds per URL, redirects and the whole answer included (httpx's own timeout bounds
    each read, which a broker sending a byte now and then would always meet)."""

    def __init__(
        self,
        urls: tuple[str, ...],
        *,
        auth: ClientAuth = NO_AUTH,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not urls:
            raise ValueError("no admin URL")
        self.urls = urls
        self.auth = auth
        self.timeout = timeout
        self._client = httpx.AsyncClient(
            timeout=timeout,
            follow_redirects=False,
            verify=auth.ssl_context or True,
            transport=transport,
        )

    async def stats(self, topic: str) -> TopicStats | None:
        """The stats of `topic` (a full name); None when its broker has no such topic."""
        response = await self._ask("GET", topic, "/stats")
        if response is None:
            return None
        try:
            return stats_from_document(topic, response.json())
        except (ValueError, StatsFormatError) as exc:
            raise BackendError(
                f"stats of {topic} from {response.url}: {exc}", reason="bad_answer"
            ) from None

    async def delete(self, topic: str, *, force: bool = False) -> bool:
        """Delete `topic`; False when its broker has no such topic, TopicBusy when it has
        connected clients and not `force`."""
        params = {"force": "true"} if force else {}
        return await self._ask("DELETE", topic, "", params) is not None

    async def partitions(
        self,
        method: str,
        topic: str,
        *,
        count: int | None = None,
        params: dict[str, str] | None = None,
    ) -> httpx.Response | None:
        """`method` on `/partitions` of `topic` (the count as the body, for PUT and POST):
        the answer of the broker that answers for it, its refusals (4xx) included; None for
        404."""
        content = None if count is None else str(count).encode()
        return await self._ask(
            method, topic, "/partitions", params, content=content, returned=_PARTITION_REFUSALS
        )

    async def partitioned(self, namespace: str, domain: str = "persistent") -> list[str]:
        """The partitioned topics of `namespace` ("tenant/namespace") in `domain`: the union
        of every admin URL's list (each mop broker lists those it owns; any Pulsar broker
        lists all). BackendError when no URL answers."""
        path = f"{ADMIN_PREFIX}/{domain}/{namespace}/partitioned"
        found: set[str] = set()
        failures: list[str] = []
        for base in self.urls:
            try:
                with trio.fail_after(self.timeout):
                    response = await self._follow("GET", base + path, None)
                document = response.json() if response.status_code == 200 else None
            except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
                failures.append(f"{base}: {exc or type(exc).__name__}")
                continue
            except trio.TooSlowError:
                failures.append(f"{base}: no answer within {self.timeout:g} s")
                continue
            if not isinstance(document, list):
                failures.append(f"{base}: HTTP {response.status_code} {answer_reason(response)}")
                continue
            found.update(name for name in document if isinstance(name, str))
        if failures and len(failures) == len(self.urls):
            raise BackendError(
                f"the brokers' admin did not list {namespace}: {'; '.join(failures)}",
                reason="unavailable",
            )
        return sorted(found)

    async def _ask(
        self,
        method: str,
        topic: str,
        suffix: str,
        params: dict[str, str] | None = None,
        *,
        content: bytes | None = None,
        returned: frozenset[int] = frozenset(),
    ) -> httpx.Response | None:
        """The answer of the first URL that answers for `topic` (None: it has no such topic);
        a status of `returned` is the caller's to read."""
        try:
            path = topic_path(topic) + suffix
        except TopicError as exc:
            raise BackendError(str(exc), reason="invalid_topic") from None
        return await self._ask_at(method, path, topic, params, content=content, returned=returned)

    async def delete_schema(self, topic: str) -> int | None:
        """Delete `topic`'s schema; the latest version it had, None when it had none."""
        try:
            name = PulsarTopicName.parse(topic)
        except TopicError as exc:
            raise BackendError(str(exc), reason="invalid_topic") from None
        local = quote(name.local_name, safe="")
        path = f"{ADMIN_PREFIX}/schemas/{name.tenant}/{name.namespace}/{local}/schema"
        response = await self._ask_at("DELETE", path, topic)
        if response is None:
            return None
        try:
            version = response.json()["version"]
            return int(version) if version is not None else None
        except (ValueError, KeyError, TypeError):
            raise BackendError(
                f"schema delete of {topic} from {response.url}: {response.text[:80]}",
                reason="bad_answer",
            ) from None

    async def schema_compatibility(self, namespace: str) -> Compatibility:
        """The schema compatibility rule of `namespace` ("tenant/namespace")."""
        response = await self._ask_at("GET", _namespace_path(namespace), namespace)
        if response is None:
            raise BackendError(f"no namespace {namespace}", reason="not_found")
        try:
            value = response.json()
            # A namespace without a rule of its own: Pulsar brokers then apply FULL.
            return Compatibility.FULL if value == "UNDEFINED" else Compatibility(value)
        except ValueError:
            raise BackendError(
                f"schema compatibility of {namespace} from {response.url}: {response.text[:80]}",
                reason="bad_answer",
            ) from None

    async def set_schema_compatibility(self, namespace: str, rule: Compatibility | None) -> None:
        """Set the rule of `namespace` (None: back to the brokers' default) at every URL: each
        member of a mop broker cluster keeps the rules of its own topics (Apache Pulsar keeps
        one, so setting it again changes nothing)."""
        # "UNDEFINED": no rule of its own (Pulsar's name for it), so the brokers' default.
        value = "UNDEFINED" if rule is None else rule.value
        for url in self.urls:
            response = await self._ask_at(
                "PUT", _namespace_path(namespace), namespace, content=json.dumps(value), urls=(url,)
            )
            if response is None:
                raise BackendError(f"{url}: no namespace {namespace}", reason="not_found")

    async def _ask_at(
        self,
        method: str,
        path: str,
        topic: str,
        params: dict[str, str] | None = None,
        content: str | bytes | None = None,
        urls: tuple[str, ...] | None = None,
        returned: frozenset[int] = frozenset(),
    ) -> httpx.Response | None:
        """The answer of the first URL (of `urls`, else of all) that answers `method path`
        (None: a 404); a status of `returned` is the caller's to read."""
        failures: list[str] = []
        # Why the brokers that answered 421 do not answer for the topic: another member owns
        # it, or (a broker's admin.allowed_hosts) they do not answer for the host asked.
        misdirected: list[str] = []
        for base in urls or self.urls:
            try:
                with trio.fail_after(self.timeout):
                    response = await self._follow(method, base + path, params, content)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                failures.append(f"{base}: {exc or type(exc).__name__}")
                continue
            except trio.TooSlowError:
                failures.append(f"{base}: no answer within {self.timeout:g} s")
                continue
            status = response.status_code
            if status == NOT_OWNER:
                misdirected.append(f"{base}: {answer_reason(response)}")
                continue
            if status in (200, 204) or status in returned:
                return response
            if status == 404:
                return None
            if status in _BUSY:
                raise TopicBusy(f"{topic}: {answer_reason(response)}")
            if status in _REFUSED:
                raise BackendError(
                    f"{base} refused the proxy's credentials (cluster.auth):"
                    f" {answer_reason(response)}",
                    reason="not_authorized",
                )
            failures.append(f"{base}: HTTP {status} {answer_reason(response)}")
        if failures:
            log.debug("%s %s: %s", method, topic, "; ".join(failures))
            raise BackendError(
                f"the brokers' admin did not answer for {topic}: {'; '.join(failures)}",
                reason="unavailable",
            )
        raise BackendError(
            f"no broker of cluster.admin_url owns {topic} (list every broker's admin URL): "
            + "; ".join(misdirected),
            reason="unavailable",
        )

    async def namespace_read(self, path: str) -> Any:
        """The JSON answer to `GET path` (a namespace's policy) of the first URL that gives
        one: every broker of Apache Pulsar and of a mop cluster answers for any namespace."""
        failures: list[str] = []
        for base in self.urls:
            response = await self._namespace_call("GET", base, path, None, None, failures)
            if response is not None:
                try:
                    return response.json()
                except ValueError:
                    failures.append(f"{base}: the answer is not JSON")
        raise self._unanswered(path, failures)

    async def namespace_change(
        self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None
    ) -> None:
        """`method path` (setting or removing a namespace's policy) on every URL: each mop
        broker keeps its own policies; Apache Pulsar's brokers share theirs, and setting the
        same one again is harmless. BackendError naming the URLs that did not take it."""
        failures: list[str] = []
        for base in self.urls:
            await self._namespace_call(method, base, path, body, params, failures)
        if failures:
            raise self._unanswered(path, failures)

    async def _namespace_call(
        self,
        method: str,
        base: str,
        path: str,
        body: Any,
        params: dict[str, str] | None,
        failures: list[str],
    ) -> httpx.Response | None:
        """The answer of `base` when it took the request; None (with why, in `failures`)
        when it did not. Bad input is the caller's: a 400 or 412 raises at once."""
        try:
            with trio.fail_after(self.timeout):
                content = None if body is None else json.dumps(body)
                response = await self._follow(method, base + path, params, content)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            failures.append(f"{base}: {exc or type(exc).__name__}")
            return None
        except trio.TooSlowError:
            failures.append(f"{base}: no answer within {self.timeout:g} s")
            return None
        status = response.status_code
        if status in (200, 204):
            return response
        if status in (400, 412):
            raise BackendError(answer_reason(response), reason="invalid_request")
        if status in _REFUSED:
            raise BackendError(
                f"{base} refused the proxy's credentials (cluster.auth): {answer_reason(response)}",
                reason="not_authorized",
            )
        failures.append(f"{base}: HTTP {status} {answer_reason(response)}")
        return None

    @staticmethod
    def _unanswered(path: str, failures: list[str]) -> BackendError:
        log.debug("%s: %s", path, "; ".join(failures))
        return BackendError(
            f"the brokers' admin did not take {path}: {'; '.join(failures)}", reason="unavailable"
        )

    async def _follow(
        self,
        method: str,
        url: str,
        params: dict[str, str] | None,
        content: str | bytes | None = None,
    ) -> httpx.Response:
        """The answer to `method url`, redirects followed with the proxy's credentials (httpx
        would drop them on the way to another broker); TooManyRedirects for a loop."""
        headers = _headers(self.auth)
        if content is not None:
            headers["content-type"] = "application/json"
        response = await self._client.request(
            method, url, params=params, headers=headers, content=content
        )
        for _ in range(_MAX_REDIRECTS):
            location = response.headers.get("location")
            if response.status_code not in _REDIRECTS or not location:
                return response
            target = response.url.join(location)
            if response.url.scheme == "https" and target.scheme != "https":
                headers = {}  # never sent in the clear
            await response.aclose()
            response = await self._client.request(method, target, headers=headers, content=content)
        raise httpx.TooManyRedirects(
            f"more than {_MAX_REDIRECTS} redirects", request=response.request
        )

    async def aclose(self) -> None:
        await self._client.aclose()


def _namespace_path(namespace: str) -> str:
    tenant, sep, name = namespace.partition("/")
    if not (tenant and sep and name) or "/" in name:
        raise BackendError(f"{namespace!r} is not tenant/namespace", reason="invalid_topic")
    return f"/admin/v2/namespaces/{quote(tenant, safe='')}/{quote(name, safe='')}" + (
        "/schemaCompatibilityStrategy"
    )


def answer_reason(response: httpx.Response) -> str:
    """The reason a broker gave: Pulsar's {"reason": ...}, mop's {"error": ...}, or the text."""
    try:
        document = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(document, dict):
        for key in ("reason", "error", "message"):
            if isinstance(document.get(key), str):
                return str(document[key])
    return response.text[:200]
