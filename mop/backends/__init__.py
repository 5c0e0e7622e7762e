"""Backends of the messaging processor: `local` (merged mode, the colocated broker) and
`cluster` (separated mode, remote brokers through pulsar-client)."""
