"""Unit tests of the local (merged-mode) backend, one file per module of mop.backends.local."""
