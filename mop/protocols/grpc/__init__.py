"""gRPC (Apache Pulsar PIP-59): Pulsar producers and consumers over gRPC streams.

The pure core (no trio, no sockets) is here: `status` (status codes), `proto` (the service
definition and its generated messages). The trio server and the service's method handlers,
which see only the processor, are in `serving`.
"""
