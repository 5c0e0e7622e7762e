"""End-to-end tests of the Pulsar protocol against a real node, with the real pulsar-client."""
