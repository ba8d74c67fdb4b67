"""Packaging beside pyproject.toml: an install adds one name, `quorum` (and the `quorum` command).

The repository keeps coordinator/, sites/, protocol/, ... at its top level and its code imports
them by their own names; a wheel puts each inside quorum/ (package_dir) and rewrites, in the
built copy only, every import of them to its `quorum.` name (quorum._house.rewrite_imports).
docs/architecture.md, "Packaging: one name, quorum"."""

import importlib.util
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

_spec = importlib.util.spec_from_file_location("_house", Path(__file__).parent / "quorum" / "_house.py")
_house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_house)
HOUSE = _house.HOUSE


class BuildNamespaced(build_py):
    """build_py, then each built module's house imports under the `quorum` name."""

    def build_module(self, module, module_file, package):
        written, copied = super().build_module(module, module_file, package)
        path = Path(written)
        path.write_text(_house.rewrite_imports(path.read_text()))
        return written, copied


packages = ["quorum"] + [f"quorum.{name}" for name in find_packages(include=list(HOUSE) + [f"{h}.*" for h in HOUSE])]
setup(packages=packages,
      package_dir={f"quorum.{h}": h for h in HOUSE},
      package_data={"quorum.scenarios": ["*.yaml", "*/*.yaml"]},
      cmdclass={"build_py": BuildNamespaced})
