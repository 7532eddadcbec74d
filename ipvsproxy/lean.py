"""Import pyroute2 and kubernetes without the whole of their top-level packages.

Both packages' `__init__` import everything they have: pyroute2's brings in NDB, IPDB,
wireless, devlink, plan9 and its mocks (with unittest and sqlite3); kubernetes' brings in the
dynamic client with jsonschema, websockets, leader election and informers. ipvsproxy uses
none of these, and a daemon keeps every module it imported for as long as it runs: the two
`__init__`s cost ~10 MB of resident memory and ~450 modules to load (seconds under emulation).

`install()` puts a finder in front of the import system for just those two names. Their
package module is created without running its `__init__`; submodules import as usual
(`pyroute2.netlink`, `kubernetes.client`), and a name ipvsproxy takes from the package itself
comes from the module that defines it (`LEAN`). Any other name asked of the package runs the
real `__init__` first, so code that wants the whole package (tests, other users of the
process) still gets it, with the same objects.
"""

from __future__ import annotations

import _thread
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec


# package -> {name taken from the package itself: the submodule that defines it}
LEAN: dict[str, dict[str, str]] = {
    "pyroute2": {"IPRoute": "pyroute2.iproute", "IPSet": "pyroute2.ipset"},
    "kubernetes": {},
}

# (threading, importlib: imports the `ls` path does not need; they load when the finder is used)
_lock = _thread.RLock()


class _Finder:  # a MetaPathFinder
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in LEAN:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return spec
        spec.loader = _Loader(spec.loader, LEAN[fullname])  # type: ignore[assignment]
        return spec


class _Loader:  # a Loader
    def __init__(self, real: Any, names: dict[str, str]) -> None:
        self.real, self.names = real, names

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module, with __path__ set from the spec

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__

        def __getattr__(attr: str) -> Any:
            from importlib import import_module

            with _lock:
                if "__getattr__" not in vars(module):  # another thread ran the real one
                    return getattr(module, attr)
                where = self.names.get(attr)
                if where is not None:
                    value = getattr(import_module(where), attr)
                    setattr(module, attr, value)
                    return value
                if not attr.startswith("__"):
                    try:
                        return import_module(f"{name}.{attr}")
                    except ModuleNotFoundError as exc:
                        if exc.name != f"{name}.{attr}":
                            raise
                # anything else: the package's real __init__, then the name as it defines it
                del module.__getattr__
                self.real.exec_module(module)
                return getattr(module, attr)

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


def install() -> None:
    """Put the finder first on sys.meta_path (once). A package already imported in full
    stays as it is."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
