"""The build backend (build_support/mop_build.py): setuptools', plus mypyc for a compiled build
(COMPILE_MOP=1), which an editable install refuses."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def backend() -> ModuleType:
    path = ROOT / "build_support" / "mop_build.py"
    if not path.is_file():
        pytest.skip("runs from a source checkout (the backend is not installed)")
    spec = importlib.util.spec_from_file_location("mop_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _setuptools_requires(seen: list[str | None]) -> object:
    def requires(config_settings: object = None) -> list[str]:
        seen.append(os.environ.get("COMPILE_MOP"))
        return ["wheel"]

    return requires


def test_a_compiled_build_requires_mypyc_and_collects_the_rest_as_a_pure_build(
    backend: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(
        backend.build_meta, "get_requires_for_build_wheel", _setuptools_requires(seen)
    )
    monkeypatch.setenv("COMPILE_MOP", "1")
    assert backend.get_requires_for_build_wheel() == ["wheel", backend.MYPYC_REQUIREMENT]
    # setup.py ran pure (mypyc is not installed yet at that point) and the setting is back.
    assert seen == ["0"]
    assert os.environ["COMPILE_MOP"] == "1"


def test_a_pure_build_requires_what_setuptools_does(
    backend: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(
        backend.build_meta, "get_requires_for_build_wheel", _setuptools_requires(seen)
    )
    monkeypatch.delenv("COMPILE_MOP", raising=False)
    assert backend.get_requires_for_build_wheel() == ["wheel"]
    assert "COMPILE_MOP" not in os.environ


def test_an_editable_install_refuses_to_compile(
    backend: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPILE_MOP", "1")
    with pytest.raises(RuntimeError, match="editable"):
        backend.get_requires_for_build_editable()
    with pytest.raises(RuntimeError, match="editable"):
        backend.build_editable("unused")
