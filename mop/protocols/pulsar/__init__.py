"""The Pulsar binary protocol: pure codec and connection state machine (adapter to come)."""
