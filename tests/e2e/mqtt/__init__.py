"""End-to-end tests of MQTT against a real node, each run in merged and in separated mode."""
