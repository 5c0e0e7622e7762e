"""Helpers for tests of mop and of applications that embed it."""

from mop.testing.certs import TestCertificates, make_test_certificates

__all__ = ["TestCertificates", "make_test_certificates"]
