"""gRPC (Apache Pulsar PIP-59): Pulsar producers and consumers over gRPC streams.

The pure core (no trio, no sockets) is here: `status` (status codes), `proto` (the service
definition and its generated messages), the HTTP/2 side (`connection`, `framing`, `headers`,
`overload`) and the service's rules: `metadata` (the call metadata that opens a call),
`mapping` (messages, ids and topic names), `errors` (backend errors as status codes),
`authentication` (the credentials of a call) and `routing` (the partition of a produced
message). The trio server and the service's method handlers, which see only the processor,
are in `serving`.
"""
