"""mop: an MQTT and Pulsar messaging gateway and broker.

What applications embed: `open_node` (an async context manager that runs a node),
`serve_node` (the same as a task for `nursery.start`), `Settings` and the message types.
"""

from typing import TYPE_CHECKING, Any

from mop.message import Delivery, Message, MessageId
from mop.settings import Settings
from mop.version import VERSION as __version__

if TYPE_CHECKING:
    from mop.node import Node, StartupError, open_node, serve_node

# Loaded on first use: importing the node loads every protocol, OpenTelemetry and the HTTP
# server, which the command-line tools other than `mop run` do not need.
_FROM_NODE = frozenset({"Node", "StartupError", "open_node", "serve_node"})


def __getattr__(name: str) -> Any:
    if name in _FROM_NODE:
        import mop.node

        return getattr(mop.node, name)
    raise AttributeError(f"module 'mop' has no attribute {name!r}")


__all__ = [
    "Delivery",
    "Message",
    "MessageId",
    "Node",
    "Settings",
    "StartupError",
    "__version__",
    "open_node",
    "serve_node",
]
