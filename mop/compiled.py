"""The modules a compiled build (`COMPILE_MOP=1 pip install .`) compiles to C with mypyc, and
which of them this process runs compiled. Every one is also shipped as Python source, which a
pure install runs; the two behave the same.

This module imports nothing from mop: `setup.py` reads `COMPILED_MODULES` from it before mop's
dependencies are installed.
"""

from __future__ import annotations

import importlib
from importlib.machinery import EXTENSION_SUFFIXES

__all__ = ["COMPILED_MODULES", "compiled_modules"]

# Pure modules (no I/O, no trio) that the per-message work runs through, chosen by profiles of
# a merged node under load, and that nothing patches or subclasses from outside. A module here
# must keep mypyc's rules: its classes are closed (no attributes beyond those declared, no
# subclass defined in a module that is not compiled) and its annotations are enforced at run
# time. The packet and message dataclasses stay in Python: they are built by a class decorator
# that mypyc does not compile, and every layer constructs them.
COMPILED_MODULES: tuple[str, ...] = (
    "mop.protocols.receive_buffer",
    "mop.protocols.mqtt.properties",
    "mop.protocols.mqtt.encoder",
    "mop.protocols.mqtt.codec",
    "mop.protocols.mqtt.connection",
    "mop.topics",
)


def compiled_modules() -> list[str]:
    """The modules of `COMPILED_MODULES` that were loaded from a compiled extension."""
    found = []
    for name in COMPILED_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        if path.endswith(tuple(EXTENSION_SUFFIXES)):
            found.append(name)
    return found
