"""The examples' documented install line installs every package they import."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The distribution of each third-party module the examples import (a new import must be added
# here, and to the example's extra).
DISTRIBUTIONS = {"paho": "paho-mqtt", "pyspark": "pyspark", "pyarrow": "pyarrow"}
EXAMPLES = {"examples/spark/pipeline.py": "spark-example"}
# A requirement's distribution name and extras: "mop[spark]", "paho-mqtt>=2.1".
REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9_.-]+)(?:\[(?P<extras>[^\]]+)\])?.*")


def imported_modules(path: Path) -> set[str]:
    """The top-level modules `path` imports, apart from the standard library and mop."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.partition(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__", "mop"}


def extra_distributions(extra: str) -> set[str]:
    """The distributions `pip install '.[extra]'` installs besides mop's own dependencies,
    following extras of mop itself (`mop[spark]`)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    names: set[str] = set()
    for requirement in extras[extra]:
        match = REQUIREMENT.fullmatch(requirement)
        assert match is not None, requirement
        name, inner = match["name"], match["extras"]
        if name == project["name"]:
            for nested in (inner or "").split(","):
                names |= extra_distributions(nested.strip())
        else:
            names.add(name.lower())
    return names


@pytest.mark.parametrize(("example", "extra"), sorted(EXAMPLES.items()))
def test_the_examples_extra_installs_what_it_imports(example: str, extra: str) -> None:
    modules = imported_modules(ROOT / example)
    assert modules <= DISTRIBUTIONS.keys(), f"add {modules - DISTRIBUTIONS.keys()} to DISTRIBUTIONS"
    missing = {DISTRIBUTIONS[module] for module in modules} - extra_distributions(extra)
    assert not missing, f"the {extra!r} extra lacks {missing}"
    install = f"pip install -e '.[{extra}]'"
    assert install in (ROOT / example).read_text()
    assert install in (ROOT / Path(example).parent / "README.md").read_text()
