"""The import-linter contracts of `.importlinter` (DESIGN.md section 2): they name modules that
exist, they cover every module of a protocol's pure core and every part of the cluster backend,
and a broken rule fails the check."""

from __future__ import annotations

import ast
import configparser
import fnmatch
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mop

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / ".importlinter"
MODULE_KEYS = ("source_modules", "forbidden_modules", "ancestors")


def modules() -> set[str]:
    found = {"mop"}
    for info in pkgutil.walk_packages(mop.__path__, "mop."):
        found.add(info.name)
    return found


def contracts() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(inline_comment_prefixes=None, comment_prefixes=("#",))
    parser.read(CONTRACTS)
    return parser


def listed(section: configparser.SectionProxy, key: str) -> list[str]:
    return [line.strip() for line in section.get(key, "").splitlines() if line.strip()]


def matching(expression: str, names: set[str]) -> set[str]:
    """The modules an import-linter expression names ("*" one level, "**" any number)."""
    if "*" not in expression:
        return {expression} & names
    parts = expression.split(".")
    return {
        name
        for name in names
        if ("**" in parts and fnmatch.fnmatchcase(name, expression.replace("**", "*")))
        or (len(name.split(".")) == len(parts) and fnmatch.fnmatchcase(name, expression))
    }


def test_every_module_a_contract_names_exists() -> None:
    names = modules()
    for section in contracts().sections():
        for key in MODULE_KEYS:
            for expression in listed(contracts()[section], key):
                if expression.startswith("mop"):
                    assert matching(expression, names), f"[{section}] {key}: {expression}"


def test_every_module_of_a_protocol_core_is_held_to_the_pure_rule() -> None:
    pure = set(listed(contracts()["importlinter:contract:pure-core"], "source_modules"))
    for name in sorted(modules()):
        parts = name.split(".")
        if parts[:2] != ["mop", "protocols"] or len(parts) < 3 or parts[2] == "base":
            continue
        if "serving" in parts or "driver" in parts or parts[-1] == "client":
            continue  # the trio side of an adapter, and the protocol's clients
        assert name in pure, f"{name} is in a protocol's pure core but not in the pure-core rule"


CLUSTER = "mop.backends.cluster"
CLUSTER_BACKEND = f"{CLUSTER}.backend"


def cluster_parts() -> list[str]:
    """The modules of the cluster backend's package but its `__init__` and `backend`."""
    return sorted(
        name for name in modules() if name.startswith(f"{CLUSTER}.") and name != CLUSTER_BACKEND
    )


def test_every_part_of_the_cluster_backend_is_kept_from_the_backend_module() -> None:
    parts = set(listed(contracts()["importlinter:contract:cluster-parts"], "source_modules"))
    for name in cluster_parts():
        assert name in parts, f"{name} is a part of the cluster backend but not in its rule"


def test_no_part_of_the_cluster_backend_imports_it_even_for_type_checkers() -> None:
    # The contracts leave out imports made only for type checkers; this rule has no exception.
    for name in cluster_parts():
        path = ROOT / Path(*name.split(".")).with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                imported = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for module in imported:
                assert module != CLUSTER, f"{name} imports {CLUSTER} (its __init__ is the backend)"
                below = module == CLUSTER_BACKEND or module.startswith(f"{CLUSTER_BACKEND}.")
                assert not below, f"{name} imports {module}"


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """A copy of the package and its contracts, to break."""
    shutil.copytree(ROOT / "mop", tmp_path / "mop", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CONTRACTS, tmp_path / ".importlinter")
    return tmp_path


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("importlinter", reason="import-linter is part of the test extras")
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", command, "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_contracts_hold_on_the_tree_as_it_is(tree_copy: Path) -> None:
    result = lint_imports(tree_copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_codec_that_imports_trio_breaks_the_pure_rule(tree_copy: Path) -> None:
    codec = tree_copy / "mop" / "protocols" / "mqtt" / "codec.py"
    codec.write_text(codec.read_text() + "\nimport trio  # noqa\n")
    result = lint_imports(tree_copy)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "mop.protocols.mqtt.codec -> trio" in result.stdout


def test_a_processor_that_imports_a_protocol_breaks_its_rule(tree_copy: Path) -> None:
    processor = tree_copy / "mop" / "processor" / "processor.py"
    processor.write_text(processor.read_text() + "\nimport mop.protocols.mqtt.packets  # noqa\n")
    result = lint_imports(tree_copy)
    assert result.returncode != 0
    assert "The processor knows no protocol" in result.stdout


def test_a_rule_that_names_a_module_that_is_gone_fails(tree_copy: Path) -> None:
    (tree_copy / "mop" / "broker" / "grace.py").rename(tree_copy / "mop" / "broker" / "lapse.py")
    result = lint_imports(tree_copy)
    assert result.returncode != 0
    assert "mop.broker.grace" in result.stdout + result.stderr


def test_a_cluster_part_that_imports_the_backend_breaks_its_rule(tree_copy: Path) -> None:
    part = tree_copy / "mop" / "backends" / "cluster" / "fanout_consumer.py"
    part.write_text(part.read_text() + "\nimport mop.backends.cluster.backend  # noqa\n")
    result = lint_imports(tree_copy)
    assert result.returncode != 0
    assert "The parts of the cluster backend do not import the backend" in result.stdout
