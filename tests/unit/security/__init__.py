"""Unit tests of authentication, authorization and abuse protection."""
