"""Unit tests of the processor."""
