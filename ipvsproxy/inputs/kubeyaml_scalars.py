"""What one scalar's text means, for the YAML reader in kubeyaml.py: plain,
single- and double-quoted scalars as keys and as values, `{}` and `[]`, and the headers that
open a block scalar, each distinct text worked out once (_Scalars); and the quoting rules
(escapes, what a line of a quoted scalar may hold) that kubeyaml.py's readers of scalars over
several lines use too. Lines, indentation and collections are kubeyaml.py's.

What a plain scalar means (str, int, bool, null, float) is decided by PyYAML's resolver
table and KubectlLoader's constructors (ipvsproxy/inputs/kubectl_yaml.py: CSafeLoader's, except
where kubectl reads a string), so `0x1F`, `1_000`, `yes`, `0755`, `.inf`, `=` or
`2026-01-01` come out exactly as KubectlLoader makes them. A program that registers other
constructors or path resolvers on KubectlLoader gets every text sent back. Where PyYAML lacks
libyaml, the same holds of its pure-Python loader, which reads the subset alike (the tests
compare with both).

The names keep their leading underscore: they are kubeyaml.py's internals, kept in a file of
their own so that each file has one job, and used nowhere else. Raising _Outside anywhere sends
the whole text back to KubectlLoader.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from yaml.constructor import SafeConstructor
from yaml.nodes import ScalarNode

from ipvsproxy.inputs.kubectl_yaml import SCALAR_CONSTRUCTORS, KubectlLoader

_STR = "tag:yaml.org,2002:str"
# The types a plain scalar may resolve to, and the constructor KubectlLoader uses for each
# (kubectl's reading: timestamps, `=` and a `<<` value as their text, ...). A `<<` key sends
# the text back: the loader merges, or not (kubectl_yaml.py); so does a tag outside this table.
_CONSTRUCTORS: dict[str, Callable[..., Any]] = dict(SCALAR_CONSTRUCTORS)
_STOCK_CONSTRUCTORS = {
    **_CONSTRUCTORS,
    _STR: SafeConstructor.construct_yaml_str,
    "tag:yaml.org,2002:map": SafeConstructor.construct_yaml_map,
    "tag:yaml.org,2002:seq": SafeConstructor.construct_yaml_seq,
}
_CONSTRUCTOR = SafeConstructor()
# PyYAML's implicit resolvers for a plain scalar starting with a digit, as yaml/resolver.py
# has them (exactly: compared whole, flags too). None of their patterns matches a string
# with two dots and no ':' or '-' (the float ones take one dot, or ':'; the int ones none;
# the timestamp one needs '-'), so 10.128.0.1 is a str without trying them (1 us each).
_STOCK_DIGIT_RESOLVERS = [
    ("tag:yaml.org,2002:float", re.compile(r'''^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$''', re.X)),
    ("tag:yaml.org,2002:int", re.compile(r'''^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+
                    |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$''', re.X)),
    ("tag:yaml.org,2002:timestamp", re.compile(r'''^(?:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]
                    |[0-9][0-9][0-9][0-9] -[0-9][0-9]? -[0-9][0-9]?
                     (?:[Tt]|[ \t]+)[0-9][0-9]?
                     :[0-9][0-9] :[0-9][0-9] (?:\.[0-9]*)?
                     (?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?)$''', re.X)),
]
_DIGITS = frozenset("0123456789")

# A plain scalar may not start with these (libyaml reads an indicator there); '-' may when a
# non-space follows ('-1', '-foo').
_NOT_PLAIN_FIRST = frozenset(" ?:,[]{}#&*!|>'\"%@`")
# The escapes libyaml knows in double quotes (\<TAB> aside: tabs send the text back)
_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f",
            "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85",
            "_": "\xa0", "L": "\u2028", "P": "\u2029"}
_DQ_CHARS = (r'(?:[^"\\]|\\(?:[0abtnvfre "/\\N_LP]|x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}'
             r"|U[0-9A-Fa-f]{8}))*")
_DOUBLE = re.compile(f'"({_DQ_CHARS})"')
_DOUBLE_PART = re.compile(f"({_DQ_CHARS})")  # a line's worth of a double-quoted scalar
_SINGLE_PART = re.compile("((?:[^']|'')*)")
_DOUBLE_OPEN = re.compile(r'"(?:[^"\\]|\\.)*\\?')  # no closing quote on this line
_ESCAPE = re.compile(r"\\(x..|u....|U........|.)")
_BLOCK_HEADERS = frozenset(("|", "|-", "|+", ">", ">-", ">+"))
_MAX_KEY = 1000  # libyaml gives up on a simple key 1,024 characters long


class _Outside(Exception):
    """The text is outside the subset: CSafeLoader reads it."""


def _loader() -> Any:
    """The loader whose reading kubeyaml.py reproduces: KubectlLoader, libyaml's with
    kubectl's scalars (PyYAML's pure-Python one where PyYAML was built without libyaml; both
    read the subset alike)."""
    return KubectlLoader


def _stock() -> bool:
    loader = _loader()
    if loader.yaml_path_resolvers:
        return False
    table = loader.yaml_constructors
    return all(table.get(tag) is f for tag, f in _STOCK_CONSTRUCTORS.items())


def _unescape(m: re.Match[str]) -> str:
    e = m.group(1)
    if len(e) == 1:
        return _ESCAPES[e]
    code = int(e[1:], 16)
    if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
        raise _Outside  # libyaml rejects these escapes
    return chr(code)


def _unescaped(s: str) -> str:
    return _ESCAPE.sub(_unescape, s) if "\\" in s else s


def _quoted(raw: str) -> str | None:
    """A one-line quoted scalar's value; None if `raw` is not exactly one such scalar."""
    if raw[0] == "'":
        inner = raw[1:-1]
        # a lone quote inside ends the scalar early: '' is the only way to write one
        if len(raw) < 2 or raw[-1] != "'" or "'" in inner.replace("''", ""):
            return None
        return inner.replace("''", "'")
    m = _DOUBLE.fullmatch(raw)
    return None if m is None else _unescaped(m.group(1))


def _opens(raw: str) -> bool:
    """Whether `raw` begins a quoted scalar that goes on past the end of the line."""
    if raw[0] == "'":
        return "'" not in raw[1:].replace("''", "")
    return _DOUBLE_OPEN.fullmatch(raw) is not None


def _plain_first_line(raw: str) -> None:
    """Sends back what cannot be a plain scalar, or not all of one, in block context."""
    c = raw[0]
    if (c in _NOT_PLAIN_FIRST or (c == "-" and raw[1:2] in ("", " ")) or ": " in raw
            or " #" in raw or raw[-1] in ": "):
        raise _Outside


def _combined(resolvers: list[tuple[str, re.Pattern[str]]]) -> re.Pattern[str] | None:
    """One pattern for the implicit resolvers of a first character that tries theirs in turn,
    as yaml.resolver.BaseResolver.resolve does (the first that matches gives the tag), its
    group r<n> telling that the n-th matched: one match for an address instead of three. None
    when their patterns have groups of their own or differing flags (or there are none)."""
    flags = {regexp.flags for _, regexp in resolvers}
    if len(flags) != 1 or any(regexp.groups for _, regexp in resolvers):
        return None
    flag = flags.pop()
    end = "\n" if flag & re.VERBOSE else ""  # ends a comment in a verbose pattern
    try:
        return re.compile("|".join(f"(?P<r{n}>{regexp.pattern}{end})"
                                   for n, (_, regexp) in enumerate(resolvers)), flag)
    except re.error:
        return None


def _constructed(tag: str, text: str) -> Any:
    """A plain scalar's value for its tag, as SafeConstructor makes it."""
    if tag == _STR:
        return text
    construct = _CONSTRUCTORS.get(tag)
    if construct is None:
        raise _Outside
    try:
        return construct(_CONSTRUCTOR, ScalarNode(tag, text))
    except ValueError:  # the loader fails, and says how
        raise _Outside from None


_LATER = object()  # a value on the lines that follow: a block scalar, or quotes not closed
_MISS = object()


class _Scalars:
    """Values and keys by their text, each worked out once."""

    def __init__(self) -> None:
        self.resolvers = _loader().yaml_implicit_resolvers
        self.combined: dict[str, re.Pattern[str] | None] = {}
        self.dotted = all(self.resolvers.get(d) == _STOCK_DIGIT_RESOLVERS for d in _DIGITS)
        self.values: dict[str, Any] = {}
        self.keys: dict[str, Any] = {}

    def resolved(self, text: str) -> Any:
        """A plain scalar's value: the tag of the first implicit resolver whose pattern
        matches, as yaml.resolver.BaseResolver.resolve finds it, made into a value."""
        c = text[0]
        if (c in _DIGITS and self.dotted and text.count(".") > 1 and ":" not in text
                and "-" not in text):
            return text  # an address, a version
        resolvers = self.resolvers.get(c, ())
        if not resolvers:
            return text
        if c in self.combined:
            combined = self.combined[c]
        else:
            combined = self.combined[c] = _combined(resolvers)
        if combined is not None:
            m = combined.match(text)
            return text if m is None else _constructed(
                resolvers[int(str(m.lastgroup)[1:])][0], text)
        for tag, regexp in resolvers:
            if regexp.match(text):
                return _constructed(tag, text)
        return text

    def value(self, raw: str) -> Any:
        """The value `raw` stands for; dict or list for `{}` or `[]` (made afresh at each
        use), _LATER when it goes on on the lines below."""
        v = self.values.get(raw, _MISS)
        if v is not _MISS:
            return v
        c = raw[0]
        if c not in _NOT_PLAIN_FIRST:  # most are plain: _plain_first_line, inline
            if (c == "-" and raw[1:2] in ("", " ")) or ": " in raw or " #" in raw or (
                    raw[-1] in ": "):
                raise _Outside
            v = self.resolved(raw)
        elif c == "'" or c == '"':
            v = _quoted(raw)
            if v is None:
                if _opens(raw):
                    return _LATER
                raise _Outside
        elif raw == "{}":
            v = dict
        elif raw == "[]":
            v = list
        elif raw in _BLOCK_HEADERS:
            return _LATER
        else:
            raise _Outside
        self.values[raw] = v
        return v

    def key(self, raw: str) -> Any:
        k = self.keys.get(raw, _MISS)
        if k is not _MISS:
            return k
        if not raw or len(raw) >= _MAX_KEY or raw.startswith(("---", "...")):
            raise _Outside
        c = raw[0]
        if c == "'" or c == '"':
            k = _quoted(raw)  # a quoted key with ': ' inside is cut short here: sent back
            if k is None:
                raise _Outside
        elif raw in ("{}", "[]") or raw in _BLOCK_HEADERS or raw == "<<":
            raise _Outside  # `<<`: the merge key, or not, as its value tells (the loader)
        else:
            _plain_first_line(raw)
            k = self.resolved(raw)
        self.keys[raw] = k
        return k
