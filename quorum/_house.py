"""The house's folders under the `quorum` name: one importable name for an installed Quorum.

The repository keeps the house's packages (`coordinator/`, `sites/`, `protocol/`, ...) at its top
level, beside `quorum/`, and its code imports them by their own names (`from stats.dp import
Bins`), so that the folders are what they look like. A wheel is built differently (setup.py):
each folder goes inside the package (`quorum/protocol/`, ...) and every import of a house
package in the built files is rewritten to its `quorum.` name (`rewrite_imports` below), so an
install adds exactly one name, `quorum`, to a user's path: no generic `data` or `models` to clash
with a project's own.

In a checkout (this file's folder has no `protocol/` inside it) `install()` puts the checkout on
the path, for the house's own imports, and maps `quorum.X` for X in HOUSE onto the very same
module objects as `X` (an alias, never a second copy: one registry of methods, one of codecs),
so plugins and notebooks write `quorum.stats.conformal` in a checkout as in an install.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import re
import sys
from pathlib import Path

# the house's packages, top to bottom of the layers (pyproject.toml, [tool.importlinter])
HOUSE = ("runner", "scenarios", "coordinator", "shuffler", "sites", "world", "transport", "protocol",
         "results", "learning", "models", "data", "stats", "specs")

PACKAGE = Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parent

_NAMES = "|".join(HOUSE)
_FROM = re.compile(rf"^(\s*)from ({_NAMES})([.\s])", re.M)
_IMPORT = re.compile(rf"^(\s*)import ({_NAMES})\.", re.M)
_PATH = re.compile(rf"([\"'])({_NAMES})((?:\.\w+)*:[A-Za-z_]\w*)")  # "protocol.methods.fedcp_qq:FedCPQQ"


def rewrite_imports(source: str) -> str:
    """A module's text as a wheel holds it: every import of a house package, and every
    "package.module:Class" import path into one, under the `quorum.` name."""
    source = _FROM.sub(r"\1from quorum.\2\3", source)
    source = _IMPORT.sub(r"\1import quorum.\2.", source)
    return _PATH.sub(r"\1quorum.\2\3", source)


def in_checkout() -> bool:
    """True when this `quorum` is the repository's (the house beside it), not an install's."""
    return not (PACKAGE / "protocol").is_dir() and (CHECKOUT / "protocol" / "__init__.py").is_file()


class HouseAliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`quorum.X...` (X in HOUSE) in a checkout: the module `X...` itself, under both names."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, rest = fullname.partition(".")
        if head != "quorum" or rest.split(".")[0] not in HOUSE:
            return None
        module = importlib.import_module(rest)
        return importlib.util.spec_from_loader(fullname, self, is_package=hasattr(module, "__path__"))

    def create_module(self, spec):
        return sys.modules[spec.name.removeprefix("quorum.")]

    def exec_module(self, module) -> None:
        """Nothing to run: the module ran once, under its own name."""


def install() -> None:
    if not in_checkout():
        return
    if str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))  # the house's own imports, from any working directory
    if not any(isinstance(f, HouseAliases) for f in sys.meta_path):
        sys.meta_path.insert(0, HouseAliases())
