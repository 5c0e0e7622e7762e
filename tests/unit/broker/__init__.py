"""Unit tests of the broker and its storage."""
