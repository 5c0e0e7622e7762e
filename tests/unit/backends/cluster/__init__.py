"""Unit tests of the cluster (separated-mode) backend, one file per module of
mop.backends.cluster."""
