"""Builds mop as pure Python, or with the hot pure modules compiled to C by mypyc when asked
(`COMPILE_MOP=1 pip install .`; not a MOP_* name, since those are mop's settings). The project's
metadata is in pyproject.toml.

Which modules are compiled, and why those, is in `mop/compiled.py`; every one is also shipped
as source, so a pure build and a compiled one behave the same.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def _compiled_modules() -> tuple[str, ...]:
    # Read without importing the package, whose dependencies the build does not have.
    spec = importlib.util.spec_from_file_location("_mop_compiled", ROOT / "mop" / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    modules: tuple[str, ...] = module.COMPILED_MODULES
    return modules


def _check_toolchain() -> None:
    """Fail with what is missing rather than with a compiler's error."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        sys.exit(f"COMPILE_MOP=1 needs a C compiler ({compiler}); unset it for a pure build")
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        sys.exit(
            f"COMPILE_MOP=1 needs the Python headers ({headers}, e.g. Debian's python3-dev); "
            "unset it for a pure build"
        )


def _drop_stale_extensions() -> None:
    """setuptools stages a wheel in build/lib.*, which it never empties: an extension left
    there by an earlier compiled build, of a module no longer compiled, would ship in the wheel
    and run instead of that module's source."""
    for staged in (ROOT / "build").glob("lib.*"):
        for extension in staged.rglob("*.so"):
            extension.unlink()


def _ext_modules() -> list[object]:
    if os.environ.get("COMPILE_MOP", "") != "1":
        return []
    _check_toolchain()
    _drop_stale_extensions()
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit("COMPILE_MOP=1 needs mypy (it provides mypyc) where the package is built")

    paths = [str(Path(*name.split(".")).with_suffix(".py")) for name in _compiled_modules()]
    # mypyc type-checks the modules with the project's mypy settings (pyproject.toml) first.
    # The modules it follows from them (the rest of the package) import dependencies an
    # isolated build environment does not have (trio, pulsar...): those are checked by the
    # project's own mypy run, not here, so their errors are silenced and what they import from
    # missing packages is typed Any. The compiled modules themselves import none of them.
    flags = ["--follow-imports=silent", "--ignore-missing-imports"]
    return list(mypycify([*flags, *paths], opt_level="3"))


setup(ext_modules=_ext_modules())
