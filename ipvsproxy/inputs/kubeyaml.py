"""A fast reader for the YAML that kubectl writes, and only that.

`kubectl get services,endpointslices,nodes -A -o yaml` of a 10,000-service cluster is ~15 MB
of YAML. libyaml's loader (`yaml.CSafeLoader`) takes 50-100x the json module's time on the
same objects (18 s at 10,000 services x 10 endpoints), and no general YAML library comes near
5x (libyaml's event stream alone is ~7x, the Rust ones on PyPI ~9x). But what kubectl writes
(sigs.k8s.io/yaml, i.e. go-yaml v2) is a small, regular subset of YAML: a `key: value` or
`- item` per line, block mappings and sequences by indentation, plain and quoted scalars, `|`
blocks, `{}` and `[]`, `---` between documents. PyYAML's dumper writes the same subset. Read
a line at a time with str methods, each distinct line worked out once (a dump repeats most of
its lines), that subset takes ~0.45 s at 10,000 services, ~3.4x the JSON time, each read as
`sync --once` reads it, with the cyclic collector off (bench/host_bench.py).

This module and kubeyaml_scalars.py own that reader and nothing else. `load_all(text)` returns
exactly what `list(yaml.load_all(text, Loader=KubectlLoader))` returns -- libyaml's loader
with kubectl's reading of a few plain scalars (ipvsproxy/inputs/kubectl_yaml.py); same types, same
strings -- or None when the text holds anything outside the subset; the caller then reads
the whole text with KubectlLoader. It never guesses: a line it does not fully recognise sends
the whole text back. This module reads the structure: the screening of the whole text, each
line's shape, collections by indentation, documents, and scalars that go on over several lines;
kubeyaml_scalars.py says what one scalar's text means (types as KubectlLoader reads them,
quoting and escapes). Read here: block mappings and sequences (a sequence under a key at the
key's own column or indented, `- - ` for one in another), plain, single- and double-quoted
scalars over one line or several (as PyYAML and go-yaml fold long strings), `|` and `>` blocks
with `-`/`+` chomping, `{}`, `[]`, blank lines, `---`. Sent back, among others: comments,
anchors, aliases, tags, directives, `...`, flow collections other than `{}` and `[]`, `?` keys,
a bare `-`, a `<<` key, a line indented more than 497 columns (which could nest deeper than
kubectl_yaml.MAX_DEPTH), a value on the line after its key, tabs, CR, control characters, a
byte-order mark, trailing spaces, a block scalar with an indentation indicator or no content, a
quoted key containing ': ', keys of 1,000 characters or more, and any text the loader rejects.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ipvsproxy.inputs.kubectl_yaml import MAX_DEPTH
from ipvsproxy.inputs.kubeyaml_scalars import (
    _BLOCK_HEADERS,
    _DOUBLE_PART,
    _LATER,
    _MISS,
    _SINGLE_PART,
    _opens,
    _Outside,
    _plain_first_line,
    _quoted,
    _Scalars,
    _stock,
    _unescaped,
)

__all__ = ["load_all"]

# Characters libyaml reads as other than content within a line: C0 and C1 controls (tab and
# CR among them: tabs are never indentation, CRLF is folded), DEL, NEL, the line and paragraph
# separators, the byte-order mark, and the surrogates and noncharacters it rejects. For ASCII
# text, a translation table that makes them 0.
_UNUSUAL_ASCII = bytes(0 if (c < 0x20 and c != 0x0A) or c == 0x7F else 1 for c in range(256))
_UNUSUAL = re.compile("[^\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd"
                      "\U00010000-\U0010ffff]")


def load_all(text: str) -> list[Any] | None:
    """The documents of `text`, equal to `list(yaml.load_all(text, Loader=KubectlLoader))`;
    None when `text` is outside the subset this module reads (then use KubectlLoader)."""
    # Screening the whole text at C speed rules out what no line of the subset holds:
    # trailing spaces, and the characters above (tabs and CRs among them).
    if " \n" in text or text.endswith(" "):
        return None
    if text.isascii():  # then a table lookup a byte finds them faster than a search
        if b"\0" in text.encode("ascii").translate(_UNUSUAL_ASCII):
            return None
    elif _UNUSUAL.search(text):
        return None
    if not _stock():
        return None
    try:
        return _read(text)
    except (_Outside, IndexError):  # IndexError: a line too short for what it began as
        return None


# --- scalars over several lines ------------------------------------------------------------

def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _next_line(lines: Iterator[str]) -> tuple[int, str]:
    """The next line that is not empty ('' at the end), and how many empty ones came before."""
    for blank, line in enumerate(lines):
        if line:
            return blank, line
    return 0, ""


def _block_scalar(header: str, parent: int, lines: Iterator[str],
                  final_break: bool) -> tuple[str, str | None]:
    """The value of a block scalar whose header (`|`, `>-` ...) ends a line of a collection
    at column `parent`, and the first line after it (None at the end of the text). A port of
    libyaml's yaml_parser_scan_block_scalar, for lines without tabs or trailing spaces."""
    body: list[str] = []  # its lines, indentation removed; '' for an empty line
    indent = 0
    end: str | None = None
    for line in lines:
        if line:
            n = _indent(line)
            if not indent:
                if n <= parent:
                    raise _Outside  # no content: rare, and libyaml's rules there are subtle
                indent = n
            elif n < indent:
                end = line
                break
            body.append(line[indent:])
        else:
            body.append("")
    if not indent:
        raise _Outside
    # the last line of the text has no line break when the text does not end with one
    last_break = end is not None or final_break
    folded = header[0] == ">"
    out: list[str] = []
    leading_break = trailing_breaks = ""
    leading_blank = False
    i, n = 0, len(body)
    while i < n and not body[i]:
        trailing_breaks += "\n"
        i += 1
    while i < n:
        line = body[i]
        trailing_blank = line[0] == " "
        if folded and leading_break == "\n" and not leading_blank and not trailing_blank:
            if not trailing_breaks:
                out.append(" ")
        else:
            out.append(leading_break)
        out.append(trailing_breaks)
        trailing_breaks = ""
        leading_blank = trailing_blank
        out.append(line)
        i += 1
        leading_break = "\n" if i < n or last_break else ""
        while i < n and not body[i]:
            trailing_breaks += "\n"
            i += 1
    chomp = header[1:]
    if chomp != "-":
        out.append(leading_break)
    if chomp == "+":
        out.append(trailing_breaks)
    return "".join(out), end


def _flow_scalar(raw: str, parent: int, lines: Iterator[str]) -> str:
    """The value of a quoted scalar that `raw` opens and lines that follow (indented past
    `parent`) go on with, to the line its closing quote ends. The folding of
    libyaml's yaml_parser_scan_flow_scalar: a line break is a space, n empty lines are n line
    breaks, indentation goes, and in double quotes `\\` at the end of a line joins the next
    one to it."""
    single = raw[0] == "'"
    part = _SINGLE_PART if single else _DOUBLE_PART
    out: list[str] = []
    text = raw[1:]
    joined = False  # the line before ended in an escaped line break
    blank = -1  # empty lines before this one; -1 for the first line
    while True:
        content = part.match(text).group(1)  # type: ignore[union-attr]  # matches ''
        rest = text[len(content):]
        if blank >= 0:
            out.append("\n" * blank if blank or joined else " ")
        out.append(content.replace("''", "'") if single else _unescaped(content))
        if rest[:1] == raw[0]:
            if len(rest) > 1:
                raise _Outside  # more after the closing quote
            return "".join(out)
        joined = rest == "\\" and not single
        if rest and not joined:
            raise _Outside  # an escape libyaml does not know
        blank, line = _next_line(lines)
        if not line:
            raise _Outside  # the text ends inside the quotes
        n = _indent(line)
        if n <= parent:
            raise _Outside  # libyaml takes less indented lines too; PyYAML, go-yaml never
        text = line[n:]


def _plain_goes_on(prev: str, parent: int, line: str, lines: Iterator[str],
                   scalars: _Scalars, cur: Any) -> str | None:
    """`line`, indented past the innermost collection (at column `parent`), goes on with the
    plain scalar that ended the line before (`prev`, with a '\\n' for each empty line since):
    the scalar's whole value replaces the first line's in `cur`. Returns the first line after
    the scalar (None at the end of the text). libyaml's folding: a line break is a space, n
    empty lines are n line breaks, indentation goes."""
    p = prev.rstrip("\n")
    blank = len(prev) - len(p)
    s = p.lstrip(" ")
    item = s[:2] == "- "
    if item:
        s = s[2:]
    if s[:1] in ("'", '"'):
        raise _Outside  # a quoted key or scalar: no plain scalar to go on with
    key: Any = _MISS
    q = s.find(": ")
    if q > 0:
        key = scalars.key(s[:q])
        s = s[q + 2:]
    elif not item:
        raise _Outside
    if s[:1] in ("'", '"') or s in ("{}", "[]") or s in _BLOCK_HEADERS:
        raise _Outside
    _plain_first_line(s)
    out = [s]
    while True:
        s = line.lstrip(" ")
        # a comment, or a key: libyaml would end the scalar there (and then fail)
        if s[0] == "#" or ": " in s or " #" in s or s[-1] == ":":
            raise _Outside
        out.append("\n" * blank if blank else " ")
        out.append(s)
        blank, line = _next_line(lines)
        if not line or _indent(line) <= parent:
            break
    value = scalars.resolved("".join(out))
    if key is _MISS:
        cur[-1] = value
    else:
        cur[key] = value
    return line or None


# --- lines ---------------------------------------------------------------------------------

# What a line does, by op: KV `key: scalar`, KEY `key:` (its value on the lines below), ITEM
# `- scalar`, ITEM_KV `- key: scalar`, ITEM_KEY `- key:`, NEST `- - ...` (a sequence in a
# sequence: the op carries the line's rest, `- ...` two columns in, to be read as a line of
# its own). MAKE is added when the value is made at each use: `{}` or `[]` (the op carries
# dict or list), or a value that goes on below, a block scalar or quotes not closed (the op
# carries the text that opens it). BLANK, DOC (`---`) and MORE (plain text that can only go
# on with a scalar from the lines above) are lines of their own.
# Each collection opened in another is at a greater position (below), so no line indented
# less than this nests deeper than MAX_DEPTH; one indented more goes to the loader, which
# counts (kubectl_yaml.too_deep).
_MAX_COLUMN = MAX_DEPTH // 2 - 3
KV, KEY, ITEM, ITEM_KV, ITEM_KEY, NEST, MAKE, BLANK, DOC, MORE = 0, 1, 2, 3, 4, 5, 8, 16, 17, 18
_BLANK = (0, BLANK, None, None)
_DOC = (0, DOC, None, None)


def _analyse(line: str, scalars: _Scalars) -> tuple[int, int, Any, Any]:
    """(position, op, key, value) for one line. Position is twice the column of the line's
    first character, plus 1 when that is a sequence's `- `: a sequence's items are told from
    its mapping's keys at the same column (`key:\\n- a`), and one comparison does for both."""
    s = line.lstrip(" ")
    if not s:
        return _BLANK
    i = len(line) - len(s)
    if not i and line == "---":
        return _DOC
    if i > _MAX_COLUMN:
        raise _Outside
    item = s[:2] == "- "
    if item:
        pos = 2 * i + 1
        s = s[2:]
        c = s[0]
        if c == "'" or c == '"':
            v = _quoted(s)
            if v is not None:  # a whole quoted scalar, though it may hold ': '
                return pos, ITEM, None, v
            if _opens(s):
                return pos, ITEM + MAKE, None, s
        elif c == "-" and s[1:2] == " ":
            return pos, NEST, None, " " * (i + 2) + s
        elif ": " not in s and s[-1] != ":":
            v = scalars.value(s)
            if v is _LATER:
                return pos, ITEM + MAKE, None, s
            if v is dict or v is list:
                return pos, ITEM + MAKE, None, v
            return pos, ITEM, None, v
    else:
        pos = 2 * i
    p = s.find(": ")
    if p > 0:
        k = scalars.key(s[:p])
        raw = s[p + 2:]
        v = scalars.value(raw)
        op = ITEM_KV if item else KV
        if v is _LATER:
            return pos, op + MAKE, k, raw
        if v is dict or v is list:
            return pos, op + MAKE, k, v
        return pos, op, k, v
    if s[-1] == ":":
        return pos, ITEM_KEY if item else KEY, scalars.key(s[:-1]), None
    if item:
        raise _Outside
    return pos, MORE, None, None


def _read(text: str) -> list[Any]:
    lines = text.split("\n")
    final_break = lines[-1] == ""
    if final_break:
        lines.pop()
    scalars = _Scalars()
    analysed: dict[str, tuple[int, int, Any, Any]] = {}
    known = analysed.get
    docs: list[Any] = []
    # The collections open around the current line, outermost first, as (position, container)
    # (position as _analyse gives it: the column doubled, plus 1 for a sequence); the innermost
    # is kept in fpos, cur. A document's root is the value of key 0 in a holder at column -1,
    # which no line ever matches (position -2).
    holder: dict[int, Any] = {}
    stack: list[tuple[int, Any]] = []
    fpos = -2
    cur: Any = holder
    # a mapping whose key `pk` (at position ppos) ended the line before, its value to come:
    # at first the holder, whose root comes with the first line
    pend: Any = holder
    pk: Any = 0
    ppos = -2
    # whether the document began with `---`; one that did not exists once it has a line
    explicit = False
    prev = ""  # the line before, and a '\n' for each empty line since
    after: str | None = None  # a line handed back by a scalar over several lines
    it = iter(lines)

    for line in it:
        while True:  # once per line; again for a line handed back
            a = known(line)
            if a is None:
                a = analysed[line] = _analyse(line, scalars)
            pos, op, k, v = a
            if op >= MAKE:
                if op == BLANK:
                    prev += "\n"
                    break
                if op == DOC:
                    if explicit or pend is not holder:
                        if pend is not None:
                            pend[pk] = None
                        docs.append(holder[0])
                    holder = {}
                    stack, fpos, cur = [], -2, holder
                    pend, pk, ppos = holder, 0, -2
                    explicit = True
                    break
                if op == MORE:
                    if pend is not None or pos <= fpos | 1:
                        raise _Outside
                    after = _plain_goes_on(prev, fpos >> 1, line, it, scalars, cur)
                    if after is None:
                        break
                    line, after = after, None
                    continue
                op -= MAKE
                if v is dict or v is list:
                    v = v()
                else:  # its lines follow
                    if pend is None and pos > fpos | 1:
                        raise _Outside  # on a line that goes on with a plain scalar
                    col = (pos >> 1) + 2 if op == ITEM_KV else pos >> 1
                    if v[0] == "'" or v[0] == '"':
                        v = _flow_scalar(v, col, it)
                    else:
                        v, after = _block_scalar(v, col, it, final_break)
            if pend is not None:
                # the value of the key that ended the line before: what this line opens when
                # it is indented more, or a sequence at the key's own column (`key:\n- a`,
                # how go-yaml and PyYAML write it); null otherwise
                if pos > ppos:
                    new: Any = [] if pos & 1 else {}
                    pend[pk] = new
                    stack.append((fpos, cur))
                    fpos, cur = pos, new
                else:
                    pend[pk] = None
                pend = None
            if pos != fpos:
                if pos > fpos | 1:  # indented more than the innermost collection's column
                    after = _plain_goes_on(prev, fpos >> 1, line, it, scalars, cur)
                    if after is None:
                        break
                    line, after = after, None
                    continue
                # the end of the collections indented more, and of a sequence at the column
                # of its mapping's keys when a key comes
                lim = pos | 1
                while fpos > lim:
                    fpos, cur = stack.pop()
                if fpos == lim != pos:
                    fpos, cur = stack.pop()
                if fpos != pos:
                    raise _Outside
            if op == KV:
                cur[k] = v
            elif op == KEY:
                pend, pk, ppos = cur, k, fpos
            elif op == ITEM:
                cur.append(v)
            elif op == ITEM_KEY:  # a mapping in the sequence, its keys two columns in
                new = {}
                cur.append(new)
                stack.append((fpos, cur))
                fpos, cur = pos + 3, new
                pend, pk, ppos = new, k, fpos
            elif op == ITEM_KV:
                new = {k: v}
                cur.append(new)
                stack.append((fpos, cur))
                fpos, cur = pos + 3, new
            else:  # NEST: a sequence two columns in, its first line the rest of this one
                new = []
                cur.append(new)
                stack.append((fpos, cur))
                fpos, cur = pos + 4, new
                after = v
            prev = line
            if after is None:
                break
            line, after = after, None
    if explicit or pend is not holder:
        if pend is not None:
            pend[pk] = None
        docs.append(holder[0])
    return docs
