"""The Pulsar binary protocol: pure codec and connection state machine, and the adapter that
serves pulsar-client applications on top of the messaging processor."""
