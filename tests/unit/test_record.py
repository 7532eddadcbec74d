"""core.record.NamedTuple builds what typing.NamedTuple builds, from the same class body; and
the `ls` path imports neither typing nor the Python socket module."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

from ipvsproxy.core import ipvs, record


def _pair(body: str) -> tuple[type, type]:
    """The class body under both NamedTuples (annotations as strings, as in the package)."""
    made = []
    for base in (record.NamedTuple, typing.NamedTuple):
        ns: dict[str, object] = {"NT": base}
        exec("from __future__ import annotations\n" f"class K(NT):\n{body}", ns)
        made.append(ns["K"])
    return made[0], made[1]


BODY = '''
    """A doc."""
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()

    def twice(self) -> int:
        return self.a * 2

    @property
    def upper(self) -> str:
        return self.b.upper()

    LIMIT = 3
'''


def test_fields_defaults_methods_and_behaviour_match_typing() -> None:
    ours, theirs = _pair(BODY)
    assert ours._fields == theirs._fields == ("a", "b", "c")
    assert ours._field_defaults == theirs._field_defaults
    assert ours.__doc__ == theirs.__doc__ == "A doc."
    assert ours.__name__ == theirs.__name__ and ours.__qualname__ == theirs.__qualname__
    assert list(ours.__annotations__) == list(theirs.__annotations__)
    assert ours.__bases__ == theirs.__bases__ == (tuple,)
    for cls in (ours, theirs):
        k = cls(2)
        assert (k, k.twice(), k.upper, cls.LIMIT) == ((2, "x", ()), 4, "X", 3)
        assert k._replace(b="y") == (2, "y", ()) and k._asdict() == {"a": 2, "b": "x", "c": ()}
        assert repr(k) == "K(a=2, b='x', c=())"
        with pytest.raises(AttributeError):
            k.a = 3  # type: ignore[misc]
    assert {n for n in dir(ours) if not n.startswith("__")} == {
        n for n in dir(theirs) if not n.startswith("__")}


@pytest.mark.parametrize("body, error", [
    ("    a: int = 1\n    b: int\n", TypeError),  # a non-default field after a default one
    ("    a: int\n    def _replace(self): pass\n", AttributeError),  # typing's prohibited names
    ("    a: int\n    _fields = ()\n", AttributeError),
])
def test_the_same_bodies_are_refused(body: str, error: type[Exception]) -> None:
    for base in (record.NamedTuple, typing.NamedTuple):
        with pytest.raises(error):
            exec(f"class K(NT):\n{body}", {"NT": base})


def test_the_kernel_values_are_namedtuples_with_their_type_hints() -> None:
    for cls in (ipvs.ServiceKey, ipvs.VirtualServer, ipvs.RealServer, ipvs.Stats,
                ipvs.ObservedService, ipvs.IpvsInfo, ipvs.Timeouts):
        assert issubclass(cls, tuple) and cls._fields
        assert list(typing.get_type_hints(cls)) == list(cls._fields)


def test_the_ls_path_imports_no_typing_socket_or_importlib() -> None:
    code = ("import sys\n"
            "import ipvsproxy.cli, ipvsproxy.commands.ls, ipvsproxy.kernel.ipvs\n"
            "import ipvsproxy.kernel.ipvs_dump\n"
            "print(sorted({'typing', 'socket', 'dataclasses', 'importlib'} & "
            "set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"
