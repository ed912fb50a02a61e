"""Old import paths of modules that moved, kept for one release with a DeprecationWarning.

The retrieval modules moved from ``envs/`` into ``envs/retrieval/`` (``envs.index`` is now
``envs.retrieval.index``, and so on). ``import envs.index`` and ``python -m envs.server`` still
work: a finder on ``sys.meta_path`` hands out the new module under the old name, so both names
are the same module object (patching one patches the other).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {f"envs.{name}": f"envs.retrieval.{name}" for name in (
    "corpus", "default_corpus", "defaults", "encoders", "index", "index_build", "index_embed",
    "index_memory", "remote", "rerank", "retriever", "server")}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the new module itself (one object under two names)."""

    def __init__(self, new_name: str):
        self.new_name = new_name
        self.new_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.new_name)
        self.new_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        """The new module ran already; only undo the import system's rebinding of ``__spec__``."""
        module.__spec__ = self.new_spec

    def get_code(self, fullname: str):
        """``python -m <old name>`` runs the new file's code (``runpy`` asks for it)."""
        return importlib.util.find_spec(self.new_name).loader.get_code(self.new_name)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Resolves an old module name to its new home, with a DeprecationWarning."""

    def find_spec(self, fullname, path=None, target=None):
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        warnings.warn(f"{fullname} moved to {new_name}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new_name))


def install() -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
