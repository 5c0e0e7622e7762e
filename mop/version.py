"""The version of mop: the one place it is written (pyproject reads it from here)."""

from typing import Final

VERSION: Final = "0.1.0"
# How the servers name themselves to clients (`$SYS/broker/version`, Pulsar's server_version).
SERVER_NAME: Final = f"mop {VERSION}"
