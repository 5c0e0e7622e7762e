"""mop's own Pulsar client: trio and mop's codec, for the separated proxy's link to the brokers
(see `client`, `producer`, `consumer`)."""

from mop.protocols.pulsar.driver.client import ClientOptions, PulsarClient
from mop.protocols.pulsar.driver.consumer import (
    ClientConsumer,
    ConsumerConfig,
    Received,
    ReceivedEntry,
    subscribe,
    subscribe_entries,
)
from mop.protocols.pulsar.driver.errors import (
    ClientClosed,
    ConnectionLost,
    DriverError,
    MessageTooLarge,
    ServerRefused,
    Unavailable,
)
from mop.protocols.pulsar.driver.producer import (
    ClientProducer,
    ProducerConfig,
    Ticket,
    create_producer,
)

__all__ = [
    "ClientClosed",
    "ClientConsumer",
    "ClientOptions",
    "ConnectionLost",
    "ConsumerConfig",
    "DriverError",
    "MessageTooLarge",
    "ProducerConfig",
    "PulsarClient",
    "Received",
    "ReceivedEntry",
    "ServerRefused",
    "Ticket",
    "Unavailable",
    "ClientProducer",
    "create_producer",
    "subscribe",
    "subscribe_entries",
]
