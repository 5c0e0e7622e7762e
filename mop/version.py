"""The version of mop: the one place it is written (pyproject reads it from here)."""

from typing import Final

VERSION: Final = "0.1.0"
