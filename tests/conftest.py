"""Fixtures shared by every test suite; keep only generic ones here."""
