"""Advertised listeners (Pulsar's `advertisedListeners`, setting `pulsar.advertised_listeners`):
a broker reachable at other addresses under other names (an internal network, an external one)
answers a lookup that names a listener with that listener's URLs. Pure: the setting's form,
which `mop.config` checks and the Pulsar adapter serves (its answers are
`mop.protocols.pulsar.listeners`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Listener", "listener_urls", "listeners_of"]


_PLAIN = "pulsar://"
_TLS = "pulsar+ssl://"


@dataclass(frozen=True, slots=True)
class Listener:
    """One named listener: its pulsar:// URL and its pulsar+ssl:// URL (either may be None,
    not both)."""

    name: str
    url: str | None
    url_tls: str | None


def listener_urls(value: str) -> tuple[str | None, str | None]:
    """The (pulsar://, pulsar+ssl://) URLs of one listener's setting: one URL or two,
    comma-separated, at most one of each scheme. ValueError when it is not of that form."""
    plain: str | None = None
    tls: str | None = None
    for part in (part.strip().rstrip("/") for part in value.split(",")):
        if part.startswith(_TLS) and len(part) > len(_TLS) and tls is None:
            tls = part
        elif part.startswith(_PLAIN) and len(part) > len(_PLAIN) and plain is None:
            plain = part
        else:
            raise ValueError(
                f"{value!r} is not a pulsar:// URL, a pulsar+ssl:// URL or one of each"
                " (comma-separated)"
            )
    return plain, tls


def listeners_of(setting: Mapping[str, str]) -> dict[str, Listener]:
    """The listeners of `pulsar.advertised_listeners` (name -> URLs), by name; ValueError
    for a setting that is not of that form."""
    listeners = {}
    for name, value in setting.items():
        if not name:
            raise ValueError("a listener needs a name")
        plain, tls = listener_urls(value)
        listeners[name] = Listener(name, plain, tls)
    return listeners
