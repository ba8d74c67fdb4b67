"""Names in a scenario -> the classes they stand for: Quorum's own methods, codecs, models and data
sources, those of installed packages, and classes named by import path.

One mechanism for all: a `Registry` maps names to import paths ("package.module:Class") and
imports each on first use. Quorum's own components are a table of import paths where each
registry is made; an installed package adds its own under the registry's entry-point group
(`quorum.methods`, `quorum.codecs`, `quorum.models`, `quorum.data`), the entry point's name
being the class's name; and a scenario may name a class by import path directly
(`name: mylab.quorum:TrimmedMean`), which `load` imports and registers under its name.

Lookups by name (`registry[name]`, `in`, `get`) never import a module that is not registered:
a site resolves the method a request names only among what it was started with, so no message
can make it import anything. Whatever is loaded passes the registry's `check` (the interface:
base class, required attributes) or is refused with the reason, before any process starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import entry_points


class PluginError(ValueError):
    """A name that does not resolve to a usable class; str(error) says why."""


def is_import_path(name: str) -> bool:
    """'package.module:Class' (a name with a colon) rather than a registered name."""
    return ":" in name


def import_object(path: str):
    """The object an import path 'package.module:Attr' names (PluginError saying why not)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise PluginError(f"{path!r} is not an import path of the form 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError, or anything the module raised while importing
        raise PluginError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    value = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise PluginError(f"module {module_name!r} has no attribute {attribute!r}") from None
    return value


def subclass_problem(cls: type, base: type) -> str | None:
    """Why `cls` is not a concrete subclass of `base` (None: it is one)."""
    if not issubclass(cls, base):
        return f"it does not subclass quorum.plugin.{base.__qualname__}"
    if getattr(cls, "__abstractmethods__", None):
        return f"it leaves abstract {sorted(cls.__abstractmethods__)} undefined"
    return None


def params_problem(params) -> str | None:
    """Why a class's PARAMS is not a map of parameter specs (specs.schema) (None: it is one)."""
    if not isinstance(params, dict) or not all(isinstance(v, dict) and "type" in v for v in params.values()):
        return "PARAMS must map each parameter to a spec such as {'type': 'float', 'gt': 0}"
    return None


class Registry(Mapping):
    """Names -> classes of one kind. `key` is the class attribute holding a class's name
    ("name" for methods, codecs and data sources; "kind" for models); `check(cls)` returns
    None or what is wrong with a class offered as this kind."""

    def __init__(self, kind: str, group: str, builtins: Mapping[str, str], key: str,
                 check: Callable[[type], str | None]) -> None:
        self.kind, self.group, self.key, self.check = kind, group, key, check
        self._builtins = dict(builtins)
        self._paths: dict[str, str] | None = None  # name -> import path, built-ins then entry points
        self._classes: dict[str, type] = {}  # loaded: by name, and by the import path they came from

    def _table(self) -> dict[str, str]:
        if self._paths is None:
            paths = dict(self._builtins)
            for point in entry_points(group=self.group):
                if point.name in self._builtins:
                    raise PluginError(f"entry point {point.name!r} of {self.group} ({point.value}) takes the "
                                      f"name of Quorum's own {self.kind}")
                paths[point.name] = point.value
            self._paths = paths
        return self._paths

    def __getitem__(self, name: str) -> type:
        """The class registered as `name`: KeyError if none is, PluginError if it does not load."""
        if name in self._classes:
            return self._classes[name]
        path = self._table().get(name) if isinstance(name, str) else None
        if path is None:
            raise KeyError(name)
        return self._admit(path, name)

    def builtin_modules(self) -> list[str]:
        """The modules of Quorum's own classes of this kind (what a fork server may import once,
        so that no process forked from it imports them on its first request)."""
        return sorted({path.partition(":")[0] for path in self._builtins.values()})

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and (name in self._classes or name in self._table())

    def __iter__(self) -> Iterator[str]:
        names = dict.fromkeys(self._table())
        names.update((name, None) for name in self._classes if not is_import_path(name))
        return iter(names)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def load(self, name: str) -> type:
        """The class a scenario names: a registered name, or an import path, which is imported,
        checked and registered under the class's own name (and the path). PluginError if not."""
        if not isinstance(name, str):
            raise PluginError(f"a {self.kind} is named by a string, got {name!r}")
        if name in self:
            return self[name]
        if not is_import_path(name):
            raise PluginError(f"no {self.kind} is registered as {name!r}")
        return self._admit(name, None)

    def _admit(self, path: str, registered_as: str | None) -> type:
        cls = import_object(path)
        if not isinstance(cls, type):
            raise PluginError(f"{path} is a {type(cls).__name__}, not a class")
        problem = self.check(cls)
        if problem:
            raise PluginError(f"{path} is not a usable {self.kind}: {problem}")
        own = getattr(cls, self.key, None)
        if not isinstance(own, str) or not own or is_import_path(own):
            raise PluginError(f"{path} must set the class attribute {self.key!r} to its name (no colon)")
        if registered_as is not None and own != registered_as:
            raise PluginError(f"{path} is registered as {registered_as!r} but names itself {own!r}")
        if registered_as is None and own in self and self[own] is not cls:
            raise PluginError(f"{path} names itself {own!r}, which another {self.kind} already has")
        self._classes[own] = cls
        self._classes[path] = cls
        return cls
