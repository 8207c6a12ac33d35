"""One registry type for everything rayb looks up by name: architectures, eval suites, data schemes and
evaluation corpora (lm-eval's pattern).

Built-ins are declared by the module that registers them and imported only when one of their names is
first looked up, so listing names, or validating a study that never names an lm-eval task, imports
nothing it does not use. A duplicate name is an error, never a silent overwrite, and an unknown name gets
the closest known names back.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def is_import_path(name: str) -> bool:
    """Whether a name is a user's `module:function`, not a registered name."""
    return ":" in name


class UnknownName(ValueError):
    """A name no registry entry has; the message lists the closest known names."""


class Registry(Generic[T]):
    def __init__(self, kind: str, builtins: dict[str, str] | None = None):
        self.kind = kind  # what an entry is, for messages: "architecture", "eval suite", ...
        self._entries: dict[str, T] = {}
        self._builtins = dict(builtins or {})  # name -> the module that registers it on import

    def register(self, name: str, entry: T) -> T:
        if name in self._builtins and name not in self._entries:
            importlib.import_module(self._builtins[name])  # a no-op while that module itself registers
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is already registered; choose another name")
        self._entries[name] = entry
        return entry

    def decorator(self, name: str) -> Callable[[T], T]:
        """`@registry.decorator("name")` registers the decorated function or class."""
        return lambda entry: self.register(name, entry)

    def names(self) -> list[str]:
        """Every registered and built-in name, without importing any built-in."""
        return sorted(set(self._entries) | set(self._builtins))

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._builtins

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> T:
        if name not in self._entries and name in self._builtins:
            importlib.import_module(self._builtins[name])
        if name not in self._entries:
            raise UnknownName(self.unknown(name))
        return self._entries[name]

    def items(self) -> list[tuple[str, T]]:
        """Every entry, built-ins imported."""
        return [(name, self.get(name)) for name in self.names()]

    def unknown(self, name: str) -> str:
        """The message for a name that is not registered: what is, and the closest matches."""
        close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return f"unknown {self.kind} '{name}'{hint} (available: {', '.join(self.names())})"
