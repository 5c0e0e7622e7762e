"""The Pulsar binary protocol. This package holds the pure core, which imports no trio, socket
or settings file and can be tested and fuzzed alone: `codec` (protobuf wire format), `metadata`
and `commands` (the messages), `frames` (framing, checksums, the incremental decoder),
`connection` (the server's state machine), `mapping` (Pulsar messages <-> mop messages) and
`errors`. `client` is the client side spoken over that core (trio: the cluster backend, the
Spark data source and the broker peer links use it). The adapter that serves
pulsar-client applications on top of the messaging processor is in `serving`.
"""
