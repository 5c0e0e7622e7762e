"""Unit tests of the backends, through the Backend contract."""
