"""Unit tests of the durable and in-memory storage of the broker."""
