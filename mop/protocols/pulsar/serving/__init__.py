"""The trio side of the Pulsar adapter: `adapter` (the protocol handler the node loads by entry
point), `server` (what connections share), `handler` (one connection around the pure
`ServerConnection`), its `producers` and `consumers`, and `peers` (links to the other brokers of
a cluster). Everything here does I/O; the protocol itself is in the pure core one level up.
"""
