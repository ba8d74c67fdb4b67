"""Where `quorum.protocol`, `quorum.runner`, ... live: the house's folders under the `quorum` name.

The repository keeps the house's packages (`coordinator/`, `sites/`, `protocol/`, ...) at its top
level, beside `quorum/`; an installed Quorum puts them under `quorum/` (setup.py's package_dir), so
that `quorum` is the only name an install adds to a user's path (no generic `data` or `models` to
clash with a project's own). Code always imports them as `quorum.X`. In a checkout this finder maps
exactly the names in HOUSE, and nothing else, to the folders beside `quorum/`; in an install it is
never installed, because the folders are already inside the package. docs/architecture.md says more.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

# the house's packages, top to bottom of the layers (pyproject.toml, [tool.importlinter])
HOUSE = ("runner", "scenarios", "coordinator", "shuffler", "sites", "world", "transport", "protocol",
         "learning", "models", "data", "stats", "specs")

PACKAGE = Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parent


class HouseFinder(importlib.abc.MetaPathFinder):
    """Finds `quorum.<house package>` in the checkout's top-level folder of that name."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        head, _, name = fullname.partition(".")
        if head != "quorum" or name not in HOUSE:
            return None
        folder = self.root / name
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def in_checkout() -> bool:
    """True when this `quorum` is the repository's (the house beside it), not an install's."""
    return not (PACKAGE / "protocol").is_dir() and (CHECKOUT / "protocol" / "__init__.py").is_file()


def install_finder() -> None:
    if in_checkout() and not any(isinstance(f, HouseFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, HouseFinder(CHECKOUT))
