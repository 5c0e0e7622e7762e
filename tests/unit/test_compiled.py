"""The modules a compiled build compiles (`mop.compiled`), and a check that such a build runs
them compiled: `tox -e compiled` sets REQUIRE_COMPILED_MOP=1 after `COMPILE_MOP=1` built it."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

import mop
from mop.compiled import COMPILED_MODULES, compiled_modules

SOURCE_ROOT = Path(mop.__file__).resolve().parent


def test_every_listed_module_is_shipped_as_source() -> None:
    for name in COMPILED_MODULES:
        relative = Path(*name.split(".")[1:]).with_suffix(".py")
        assert (SOURCE_ROOT / relative).is_file(), name
        importlib.import_module(name)


@pytest.mark.skipif(
    os.environ.get("REQUIRE_COMPILED_MOP") != "1",
    reason="runs against a compiled build (tox -e compiled sets REQUIRE_COMPILED_MOP=1)",
)
def test_a_compiled_build_runs_every_listed_module_compiled() -> None:
    assert compiled_modules() == list(COMPILED_MODULES)
