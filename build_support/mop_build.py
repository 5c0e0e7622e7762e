"""mop's build backend: setuptools' own, with two rules for a compiled build (`COMPILE_MOP=1`,
see `setup.py`): mypy, which provides mypyc, becomes a build requirement, and an editable
install is refused, since compiled modules next to the sources would keep running after the
sources are edited. Without `COMPILE_MOP=1` it is setuptools unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import (
    build_sdist,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

# The mypyc that compiles the modules; its generated C needs no mypy at run time.
MYPYC_REQUIREMENT = "mypy>=1.10"

_ConfigSettings = dict[str, Any] | None


def _compiling() -> bool:
    return os.environ.get("COMPILE_MOP", "") == "1"


@contextmanager
def _metadata_only() -> Iterator[None]:
    """setuptools runs setup.py to collect requirements and metadata, which do not depend on
    what is compiled: those runs build pure, so that they neither need mypyc (not installed yet
    when requirements are asked for) nor spend its time."""
    compile_setting = os.environ.get("COMPILE_MOP")
    os.environ["COMPILE_MOP"] = "0"
    try:
        yield
    finally:
        if compile_setting is None:
            del os.environ["COMPILE_MOP"]
        else:
            os.environ["COMPILE_MOP"] = compile_setting


def get_requires_for_build_wheel(config_settings: _ConfigSettings = None) -> list[str]:
    compiling = _compiling()
    with _metadata_only():
        requires = build_meta.get_requires_for_build_wheel(config_settings)
    return [*requires, MYPYC_REQUIREMENT] if compiling else requires


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: _ConfigSettings = None
) -> str:
    with _metadata_only():
        return build_meta.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(
    wheel_directory: str,
    config_settings: _ConfigSettings = None,
    metadata_directory: str | None = None,
) -> str:
    return build_meta.build_wheel(wheel_directory, config_settings, metadata_directory)


def _refuse_compiled_editable() -> None:
    if _compiling():
        raise RuntimeError(
            "COMPILE_MOP=1 builds compiled modules, which an editable install would keep "
            "running after the sources change: install with `COMPILE_MOP=1 pip install .`, "
            "or unset COMPILE_MOP for `pip install -e .`"
        )


def get_requires_for_build_editable(config_settings: _ConfigSettings = None) -> list[str]:
    _refuse_compiled_editable()
    return build_meta.get_requires_for_build_editable(config_settings)


def build_editable(
    wheel_directory: str,
    config_settings: _ConfigSettings = None,
    metadata_directory: str | None = None,
) -> str:
    _refuse_compiled_editable()
    return build_meta.build_editable(wheel_directory, config_settings, metadata_directory)
