"""Tests of mop.transport (a package so that its module names cannot clash with other tests)."""
