"""typing.NamedTuple's class syntax, without importing typing.

`typing` imports `re` and both take ~0.1 s of every `ipvsproxy ls` under emulation; the
listing path needs neither. To a type checker `NamedTuple` here is typing's. At run time a
class statement with it as its base builds what typing.NamedTuple builds: a
collections.namedtuple with the annotated fields in order, the assigned values as defaults,
the annotations, and the class body's docstring, methods and properties
(tests/unit/test_record.py compares the two).
"""

from __future__ import annotations

from collections import namedtuple

TYPE_CHECKING = False  # (typing.TYPE_CHECKING; mypy treats this name the same)
if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    # typing.py: what the class body may not set, and what it sets that is not copied over
    _PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields",
                             "_field_defaults", "_make", "_replace", "_asdict", "_source"})
    _SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})

    class _NamedTupleMeta(type):
        def __new__(mcls, typename, bases, ns):
            types = ns.get("__annotations__", {})
            defaults = []
            for field in types:
                if field in ns:
                    defaults.append(ns[field])
                elif defaults:
                    raise TypeError(f"Non-default namedtuple field {field} cannot follow "
                                    f"default field{'s' if len(defaults) > 1 else ''} "
                                    f"{', '.join(f for f in types if f in ns)}")
            cls = namedtuple(typename, list(types), defaults=defaults,
                             module=ns["__module__"])
            cls.__annotations__ = cls.__new__.__annotations__ = dict(types)
            for key, value in ns.items():
                if key in _PROHIBITED:
                    raise AttributeError("Cannot overwrite NamedTuple attribute " + key)
                if key not in _SPECIAL and key not in cls._fields:
                    setattr(cls, key, value)
            return cls

    NamedTuple = type.__new__(_NamedTupleMeta, "NamedTuple", (), {})
