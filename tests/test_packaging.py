"""An installed Quorum adds one name to a user's path: `quorum` (and the `quorum` command).

The wheel is built from a copy of the repository, installed with no dependencies into a fresh
virtual environment (its dependencies are this environment's, on the path through a .pth file,
so nothing downloads), and used from an empty directory: `import data` and the other house
folders fail, `import quorum` and its API work, the example plugin runs a session, and the
`quorum` command runs a scenario over real site processes.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from quorum._house import HOUSE

# pytest-xdist (make test runs on several workers): the wheel and its virtual environment are built once, for the module
pytestmark = pytest.mark.xdist_group("test_packaging")

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "scenarios" / "tiny.yaml"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh virtual environment with Quorum's wheel installed."""
    base = tmp_path_factory.mktemp("packaging")
    source = base / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("quorum", *HOUSE):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    wheels = base / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(source)], check=True, timeout=300)
    wheel = next(wheels.glob("quorum-*.whl"))
    env = base / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies (numpy, zmq, ...) from this environment; a .pth line only adds the folder,
    # so this environment's editable install of Quorum (a finder started by a .pth) stays out
    Path(purelib, "dependencies.pth").write_text(site.getsitepackages()[0] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    str(wheel)], check=True, timeout=300)
    return python


def _python(python: Path, code: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", **env})


def test_the_wheel_holds_quorum_and_nothing_beside_it(installed):
    wheel = next((installed.parent.parent.parent / "wheels").glob("quorum-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"quorum"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "quorum/protocol/methods/fedcp_qq.py" in names and "quorum/scenarios/quickstart.yaml" in names


def test_only_quorum_is_importable_by_name(installed, tmp_path):
    code = ("import importlib.util as u\n"
            f"house = {list(HOUSE) + ['run']!r}\n"
            "found = [name for name in house if u.find_spec(name) is not None]\n"
            "assert not found, found\n"
            "try:\n    import data\nexcept ModuleNotFoundError:\n    pass\nelse:\n    raise SystemExit('import data worked')\n"
            "import quorum, quorum.protocol.methods as m\n"
            "assert '/site-packages/quorum/' in m.__file__, m.__file__\n"
            "assert quorum.plan(alpha=0.1, sites=20, n=10)['k'] >= 1\n"
            "import sys; assert not [k for k in sys.modules if k.split('.')[0] in house], 'a bare house module loaded'\n")
    result = _python(installed, code, tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_plugin_runs_on_the_installed_quorum(installed, tmp_path):
    code = ("import numpy as np\n"
            "from quorum.plugin import run_session\n"
            "from quorum_bisection.method import BisectionCP\n"
            "rng = np.random.default_rng(0)\n"
            "sites = {f's{j}': rng.exponential(size=40) for j in range(5)}\n"
            "outcome = run_session(BisectionCP(0.1, hi=50.0), sites, lambda s: np.random.default_rng(0))\n"
            "pooled = np.sort(np.concatenate(list(sites.values())))\n"
            "k = int(np.ceil(201 * 0.9))\n"
            "assert outcome.status == 'ok' and pooled[k - 1] <= outcome.threshold <= pooled[k - 1] + 50 / 2**30\n")
    result = _python(installed, code, tmp_path, PYTHONPATH=str(ROOT / "examples" / "quorum-bisection"))
    assert result.returncode == 0, result.stderr


def test_the_quorum_command_runs_a_scenario_over_site_processes(installed, tmp_path):
    command = installed.parent / "quorum"
    result = subprocess.run([str(command), "run", str(TINY), "--trials", "1", "--out", str(tmp_path / "run")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = (tmp_path / "run" / "results.csv").read_text().splitlines()
    assert len(rows) > 1 and all(",ok," in row for row in rows[1:]), rows


def test_every_installed_module_imports_the_house_under_quorum(installed):
    """The wheel's copy of each module names the house's packages `quorum.X` (setup.py rewrote
    them), so nothing in an install reaches for a top-level `data` or `protocol`."""
    import ast

    purelib = subprocess.run([str(installed), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    bare = []
    for path in sorted(Path(purelib, "quorum").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            bare += [f"{path.relative_to(purelib)}:{node.lineno} {n}" for n in names if n.split(".")[0] in HOUSE]
    assert not bare, bare[:20]
