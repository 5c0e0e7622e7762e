"""Unit tests of what a node tells its operators: logs."""
