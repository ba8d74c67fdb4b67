"""The layers of the code (pyproject.toml, [tool.importlinter]): no import runs upward.

lint-imports reads every import statement of every module (inside functions too) and checks them
against the layers stated in pyproject.toml; these tests run it over the installed layout (the
house's folders inside quorum/, as setup.py builds a wheel), show that it catches an upward import
added to a copy of the code, and check what import-linter cannot: the statistics import nothing but
numpy, scipy and the standard library, nothing imports the CLI, every package of the repository is
placed in a layer, and no code imports a house package by its bare name (`data`, `models`, ...),
which an install does not provide.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
NOT_LAYERED = {"tests", "bench", "examples"}
sys.path.insert(0, str(ROOT))
from quorum._house import HOUSE  # noqa: E402


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _installed_layout(into: Path) -> Path:
    """A copy of the code as a wheel lays it out: quorum/ with every house package inside it."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "quorum", into / "quorum", ignore=ignore)
    for package in HOUSE:
        shutil.copytree(ROOT / package, into / "quorum" / package, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", into)
    return into


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
                          cwd=root, capture_output=True, text=True, timeout=120)


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every absolute module a file imports, anywhere in it, with the line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
    return found


def _package_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_no_import_runs_upward(tmp_path):
    result = _lint(_installed_layout(tmp_path))
    assert result.returncode == 0, f"lint-imports found an upward import:\n{result.stdout}{result.stderr}"
    assert "KEPT" in result.stdout


def test_an_upward_import_hidden_in_a_function_fails_naming_both_modules(tmp_path):
    _installed_layout(tmp_path)
    assert _lint(tmp_path).returncode == 0
    with open(tmp_path / "quorum" / "stats" / "conformal.py", "a") as f:
        f.write("\n\ndef _reach_up():\n    from quorum.runner.federation import Federation  # noqa: F401\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "quorum.stats.conformal -> quorum.runner.federation" in result.stdout, result.stdout


def test_the_statistics_import_only_numpy_scipy_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"numpy", "scipy"}
    outside = [f"{path.relative_to(ROOT)}:{line} imports {module}"
               for path in _package_files("stats") for module, line in _imports(path)
               if module.split(".")[0] not in allowed and not module.startswith("quorum.stats")]
    assert not outside, "\n".join(outside)


def test_nothing_imports_the_cli():
    importers = [f"{path.relative_to(ROOT)}:{line}" for package in ("quorum", *HOUSE)
                 for path in _package_files(package) for module, line in _imports(path)
                 if module in ("run", "quorum.cli") or module.startswith(("run.", "quorum.cli."))]
    assert not importers, f"the command line is the top of the house; imported from {importers}"


def test_no_code_imports_a_house_package_by_its_bare_name():
    """An install has no top-level `protocol` or `data`: everything imports quorum.protocol, quorum.data."""
    bare = re.compile(rf"^({'|'.join(HOUSE)})(\.|$)")
    files = [p for folder in ("quorum", *HOUSE, "tests", "bench", "examples") for p in _package_files(folder)]
    files.append(ROOT / "run.py")
    found = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in files
             for module, line in _imports(path) if bare.match(module)]
    assert not found, "\n".join(found)


def test_every_package_of_the_repository_is_in_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/*.py")} - NOT_LAYERED - {"quorum"}
    namespace = sorted(name for name in packages if not (ROOT / name / "__init__.py").is_file())
    assert not namespace, f"folders of modules without __init__.py (import-linter cannot see them): {namespace}"
    assert packages == set(HOUSE), (f"packages not in quorum/_house.py: {sorted(packages - set(HOUSE))}; "
                                    f"named there but absent: {sorted(set(HOUSE) - packages)}")
    in_layers = {name.strip() for layer in _config()["contracts"][0]["layers"]
                 for name in layer.replace(":", "|").split("|")}
    api = {p.stem for p in (ROOT / "quorum").glob("*.py")} - {"__init__", "_house"}
    assert in_layers == set(HOUSE) | api, sorted(in_layers ^ (set(HOUSE) | api))
