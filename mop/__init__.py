"""mop: an MQTT and Pulsar messaging gateway and broker.

What applications embed: `open_node` (an async context manager that runs a node),
`serve_node` (the same as a task for `nursery.start`), `Settings` and the message types.
"""

from mop.message import Delivery, Message, MessageId
from mop.node import Node, StartupError, open_node, serve_node
from mop.settings import Settings
from mop.version import VERSION as __version__

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
