"""The layers of the code (pyproject.toml, [tool.importlinter]): no import runs upward.

lint-imports reads every import statement of every module (inside functions too) and checks them
against the layers stated in pyproject.toml; these tests run it, show that it catches an upward
import added to a copy of the code, and check what import-linter cannot: the statistics import
nothing but numpy, scipy and the standard library, nothing imports the CLI, and every package of
the repository is placed in a layer. (A wheel's copy, with every import under `quorum.`, is
checked by tests/test_packaging.py.)
"""

from __future__ import annotations

import ast
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


def test_no_import_runs_upward():
    result = _lint(ROOT)
    assert result.returncode == 0, f"lint-imports found an upward import:\n{result.stdout}{result.stderr}"
    assert "KEPT" in result.stdout


def test_an_upward_import_hidden_in_a_function_fails_naming_both_modules(tmp_path):
    for package in _config()["root_packages"]:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    assert _lint(tmp_path).returncode == 0
    with open(tmp_path / "stats" / "conformal.py", "a") as f:
        f.write("\n\ndef _reach_up():\n    from runner.federation import Federation  # noqa: F401\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "stats.conformal -> runner.federation" in result.stdout, result.stdout


def test_the_statistics_import_only_numpy_scipy_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"numpy", "scipy"}
    outside = [f"{path.relative_to(ROOT)}:{line} imports {module}"
               for path in _package_files("stats") for module, line in _imports(path)
               if module.split(".")[0] not in allowed | {"stats"}]
    assert not outside, "\n".join(outside)


def test_nothing_imports_the_cli():
    importers = [f"{path.relative_to(ROOT)}:{line}" for package in ("quorum", *HOUSE)
                 for path in _package_files(package) for module, line in _imports(path)
                 if module in ("run", "quorum.cli") or module.startswith(("run.", "quorum.cli."))]
    assert not importers, f"the command line is the top of the house; imported from {importers}"


def test_every_package_of_the_repository_is_in_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/*.py")} - NOT_LAYERED - {"quorum"}
    namespace = sorted(name for name in packages if not (ROOT / name / "__init__.py").is_file())
    assert not namespace, f"folders of modules without __init__.py (import-linter cannot see them): {namespace}"
    assert packages == set(HOUSE), (f"packages not in quorum/_house.py: {sorted(packages - set(HOUSE))}; "
                                    f"named there but absent: {sorted(set(HOUSE) - packages)}")
    assert set(_config()["root_packages"]) == set(HOUSE) | {"quorum"}
    in_layers = {name.strip() for layer in _config()["contracts"][0]["layers"]
                 for name in layer.replace(":", "|").split("|")}
    api = {f"quorum.{p.stem}" for p in (ROOT / "quorum").glob("*.py")} - {"quorum.__init__", "quorum._house"}
    assert in_layers == set(HOUSE) | api, sorted(in_layers ^ (set(HOUSE) | api))
