"""Packaging beside pyproject.toml: the house's top-level folders install under the `quorum` name.

The repository keeps coordinator/, sites/, protocol/, ... at its top level (quorum/_house.py maps
them to quorum.coordinator, ... in a checkout); a wheel puts each inside quorum/, so an install adds
only `quorum` (and the `quorum` command) to a user's path. docs/architecture.md, "Packaging"."""

from setuptools import find_packages, setup

HOUSE = ("runner", "scenarios", "coordinator", "shuffler", "sites", "world", "transport", "protocol",
         "learning", "models", "data", "stats", "specs")  # the same as quorum/_house.py's HOUSE

packages = ["quorum"] + [f"quorum.{name}" for name in find_packages(include=[f"{h}" for h in HOUSE]
                                                                     + [f"{h}.*" for h in HOUSE])]
setup(packages=packages,
      package_dir={f"quorum.{h}": h for h in HOUSE},
      package_data={"quorum.scenarios": ["*.yaml", "*/*.yaml"]})
