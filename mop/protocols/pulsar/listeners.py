"""Advertised listeners in the Pulsar protocol: a broker answers a lookup that names a listener
(`advertised_listener_name`, pulsar-client's `listener_name`) with that listener's URLs (the
setting's form is `mop.advertised_listeners`'s). Pure: the answer to a name it does not have."""

from __future__ import annotations

from mop.advertised_listeners import Listener, listener_urls, listeners_of

__all__ = ["Listener", "listener_urls", "listeners_of", "unknown_listener"]


def unknown_listener(name: str) -> str:
    """What a lookup naming a listener the broker does not have is told (Pulsar's words,
    which pulsar-client recognises)."""
    return f"the broker do not have {name} listener"
