"""TEST ENVIRONMENT ONLY: stand-ins for SGLang's GPU-only modules on a CPU host.

``scripts/sglang-parser-env.sh`` installs this file into the test environment
(``.venv-sglang``) with a ``.pth`` line that imports it, so that SGLang 0.5.23's
resolution pipeline can be imported on a machine without a GPU. Never installed in
production, where SGLang is whole.

Each name in ``STUBBED`` (and every submodule of it) imports as an empty module whose
attributes are inert placeholders: enough for ``import sgl_kernel`` /
``from flashinfer.x import y`` at import time; calling into a kernel does nothing useful.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

#: GPU kernel packages (and torchvision, whose CPU build matching torch 2.13.0+cpu is not
#: on the package index this environment uses; transformers and SGLang import it).
STUBBED = frozenset({"sgl_kernel", "flashinfer", "tvm_ffi", "torchvision"})


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return _Placeholder(f"{self._name}.{key}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Placeholder(f"{self._name}()")

    def __getitem__(self, key: Any) -> Any:
        return _Placeholder(f"{self._name}[]")

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __repr__(self) -> str:
        return f"<test stub {self._name}>"


class _StubModule(types.ModuleType):
    __version__ = "0.0.0+test-stub"

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return _Placeholder(f"{self.__name__}.{key}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".", 1)[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
