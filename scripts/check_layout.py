#!/usr/bin/env python3
"""Check the workspace layout rules for every crate's `src/` tree.

1. size:  no source file over MAX_FILE_LINES non-test lines.
2. fn:    no function over MAX_FN_LINES lines (the `fn` line to its closing brace), unless a
          comment `long-fn: <reason>` sits in the contiguous comments/attributes right above it.
3. cycle: no import cycle among the sibling modules of one parent module.

Test code is left out of all three: files named `tests.rs`, files under a `tests/`, `benches/`
or `examples/` directory, files of modules declared `#[cfg(test)] mod x;`, and items marked
`#[cfg(test)]` or `#[test]` (their lines do not count towards a file's size).

Known violations live in scripts/layout-baseline.txt, one key a line (`#` starts a comment):

    size crates/pdrouter/src/cli.rs
    fn crates/pdrouter/src/app.rs start                 (a method: `Type::name`)
    cycle crates/pdrouter/src: app,http                 (the parent, then its modules sorted)

A cycle entry covers any current cycle of the same parent whose modules are a subset of its
own. The check fails on a violation the baseline does not cover and on a baseline entry that
no longer matches anything (delete it: the baseline only shrinks). A file that cannot be
parsed (unbalanced delimiters, a `mod x;` without its file) ends the check with exit code 2.

Cycles: for every module, the graph among its child modules (an inline `mod x { }` belongs to
its file), with an edge a -> b when a non-test file under a names something under b through
`crate::`, `super::` or `self::` paths (`use` trees included). Items of the parent's own file
(re-exports included) belong to the parent and make no edge. Binaries are roots of their own.

    python3 scripts/check_layout.py                    # check against the baseline
    python3 scripts/check_layout.py --report           # every violation with details, exit 0
    python3 scripts/check_layout.py --write-baseline   # rewrite the baseline from the tree

Python 3 standard library only.
"""

import argparse
import os
import re
import sys
from collections import Counter, defaultdict

MAX_FILE_LINES = 800
MAX_FN_LINES = 100
LONG_FN_RE = re.compile(r"long-fn:\s*\S")


class ParseError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Lexer
# --------------------------------------------------------------------------------------------


class Tok:
    __slots__ = ("kind", "text", "line", "end_line")

    def __init__(self, kind, text, line, end_line):
        self.kind = kind  # ident, punct, lit, lifetime, comment
        self.text = text
        self.line = line
        self.end_line = end_line

    def __repr__(self):
        return "Tok(%s %r @%d)" % (self.kind, self.text, self.line)


def _is_ident_start(c):
    return c == "_" or c.isalpha()


def _is_ident_char(c):
    return c == "_" or c.isalnum()


def tokenize(src):
    """Rust source to tokens. Comments are kept as `comment` tokens; string, raw string, byte
    string and char literals become one `lit` token each, so their braces never count."""
    toks = []
    i = 0
    n = len(src)
    line = 1

    def add(kind, start, end):
        nonlocal line
        text = src[start:end]
        nl = text.count("\n")
        toks.append(Tok(kind, text, line, line + nl))
        line += nl

    def quoted_end(j):
        # j is just past the opening quote of a (non-raw) string; return just past its end.
        while j < n:
            c = src[j]
            if c == "\\":
                j += 2
            elif c == '"':
                return j + 1
            else:
                j += 1
        raise ParseError("unterminated string literal starting on line %d" % line)

    def raw_end(j, hashes):
        # j is just past `r#..#"`; return just past the closing `"#..#`.
        close = '"' + "#" * hashes
        k = src.find(close, j)
        if k < 0:
            raise ParseError("unterminated raw string starting on line %d" % line)
        return k + len(close)

    def char_end(j):
        # j is at the opening `'` of a char literal (already decided it is one).
        if src[j + 1] == "\\":
            k = src.find("'", j + 3)
        else:
            k = j + 2
        if k < 0 or src[k] != "'":
            raise ParseError("bad char literal on line %d" % line)
        return k + 1

    def is_char_literal(j):
        # `'` at j: a char literal, or a lifetime / label?
        if j + 1 >= n:
            return False
        if src[j + 1] == "\\":
            return True
        return j + 2 < n and src[j + 2] == "'" and src[j + 1] != "\n"

    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
            continue
        if c in " \t\r\f\v\ufeff":
            i += 1
            continue
        if c == "/" and src.startswith("//", i):
            j = src.find("\n", i)
            if j < 0:
                j = n
            add("comment", i, j)
            i = j
            continue
        if c == "/" and src.startswith("/*", i):
            depth = 0
            j = i
            while True:
                if j >= n:
                    raise ParseError("unterminated block comment starting on line %d" % line)
                if src.startswith("/*", j):
                    depth += 1
                    j += 2
                elif src.startswith("*/", j):
                    depth -= 1
                    j += 2
                    if depth == 0:
                        break
                else:
                    j += 1
            add("comment", i, j)
            i = j
            continue
        if _is_ident_start(c):
            j = i + 1
            while j < n and _is_ident_char(src[j]):
                j += 1
            word = src[i:j]
            nxt = src[j] if j < n else ""
            if word in ("r", "br", "cr") and nxt in ('"', "#"):
                k = j
                while k < n and src[k] == "#":
                    k += 1
                if k < n and src[k] == '"':
                    end = raw_end(k + 1, k - j)
                    add("lit", i, end)
                    i = end
                    continue
                if word == "r" and k == j + 1 and k < n and _is_ident_start(src[k]):
                    m = k + 1
                    while m < n and _is_ident_char(src[m]):
                        m += 1
                    add("ident", i, m)  # raw identifier, text keeps its `r#`
                    i = m
                    continue
            if word in ("b", "c") and nxt == '"':
                end = quoted_end(j + 1)
                add("lit", i, end)
                i = end
                continue
            if word == "b" and nxt == "'":
                end = char_end(j)
                add("lit", i, end)
                i = end
                continue
            add("ident", i, j)
            i = j
            continue
        if c.isdigit():
            j = i + 1
            while j < n:
                d = src[j]
                if _is_ident_char(d):
                    j += 1
                elif d == "." and j + 1 < n and src[j + 1].isdigit():
                    j += 1
                else:
                    break
            add("lit", i, j)
            i = j
            continue
        if c == '"':
            end = quoted_end(i + 1)
            add("lit", i, end)
            i = end
            continue
        if c == "'":
            if is_char_literal(i):
                end = char_end(i)
                add("lit", i, end)
                i = end
                continue
            j = i + 1
            while j < n and _is_ident_char(src[j]):
                j += 1
            add("lifetime", i, j)
            i = j
            continue
        two = src[i : i + 2]
        if two in ("::", "->", "=>"):
            add("punct", i, i + 2)
            i += 2
            continue
        add("punct", i, i + 1)
        i += 1
    return toks


# --------------------------------------------------------------------------------------------
# Structure: items, functions, test code, module declarations, module references
# --------------------------------------------------------------------------------------------

BLOCK_ITEMS = {"fn", "mod", "impl", "trait", "struct", "enum", "union"}
SEMI_ITEMS = {"use", "const", "static", "type"}
QUALIFIERS = {"pub", "unsafe", "async", "const", "extern", "default", "auto"}
CONST_QUALIFIES = {"fn", "unsafe", "async", "extern", "{"}  # `const fn`, a `const { }` block
PATH_STARTS = {"crate", "super", "self"}


class Function:
    def __init__(self, name, qualname, line, end_line, is_test, allowed):
        self.name = name
        self.qualname = qualname
        self.line = line
        self.end_line = end_line
        self.is_test = is_test
        self.allowed = allowed  # the long-fn comment, or None

    @property
    def length(self):
        return self.end_line - self.line + 1


class ModDecl:
    def __init__(self, name, inline_path, line, is_test):
        self.name = name
        self.inline_path = inline_path  # inline `mod x { .. }` names around the declaration
        self.line = line
        self.is_test = is_test


class Ref:
    def __init__(self, segments, inline_path, line):
        self.segments = segments
        self.inline_path = inline_path
        self.line = line


class ParsedFile:
    def __init__(self):
        self.total_lines = 0
        self.test_lines = set()
        self.functions = []
        self.mod_decls = []  # `mod x;` (file-based modules)
        self.refs = []  # non-test references starting with crate/super/self

    @property
    def code_lines(self):
        return self.total_lines - len(self.test_lines)


def _cfg_is_test(toks, i, j):
    """Does the cfg predicate in toks[i:j] hold only under `test`?"""

    def parse(k):
        # returns (value, next index)
        t = toks[k]
        if t.text in ("all", "any", "not") and k + 1 < j and toks[k + 1].text == "(":
            vals = []
            k += 2
            while toks[k].text != ")":
                v, k = parse(k)
                vals.append(v)
                if toks[k].text == ",":
                    k += 1
            k += 1
            if t.text == "all":
                return any(vals), k
            if t.text == "any":
                return bool(vals) and all(vals), k
            return False, k
        if t.text == "test" and not (k + 1 < j and toks[k + 1].text == "="):
            return True, k + 1
        # `feature = "x"`, `unix`, ...
        k += 1
        if k < j and toks[k].text == "=":
            k += 2
        return False, k

    try:
        return parse(i)[0]
    except IndexError:
        return False


def _attr_is_test(toks, start, end):
    """toks[start] is `#`, toks[end] the closing `]`: is this `#[cfg(test)]`-like or `#[test]`?"""
    body = toks[start + 2 : end]
    if not body:
        return False
    if body[0].text == "cfg" and len(body) > 2 and body[1].text == "(":
        return _cfg_is_test(toks, start + 4, end - 1)
    # #[test], #[tokio::test], #[tokio::test(flavor = ..)]
    k = 0
    path = []
    while k < len(body) and (body[k].kind == "ident" or body[k].text == "::"):
        if body[k].kind == "ident":
            path.append(body[k].text)
        k += 1
    return bool(path) and path[-1] == "test" and (k == len(body) or body[k].text == "(")


def _impl_name(toks, i, brace):
    """Self type name of the `impl` at toks[i], whose block opens at toks[brace]."""
    k = i + 1
    if k < brace and toks[k].text == "<":
        depth = 0
        while k < brace:
            if toks[k].text == "<":
                depth += 1
            elif toks[k].text == ">":
                depth -= 1
                if depth == 0:
                    k += 1
                    break
            k += 1
    seg = []
    depth = 0
    for m in range(k, brace):
        t = toks[m]
        if t.text == "where" and depth == 0:
            break
        seg.append(t)
        if t.text == "<":
            depth += 1
        elif t.text == ">":
            depth -= 1
    depth = 0
    for m, t in enumerate(seg):
        if t.text == "<":
            depth += 1
        elif t.text == ">":
            depth -= 1
        elif t.text == "for" and depth == 0 and not (m + 1 < len(seg) and seg[m + 1].text == "<"):
            seg = seg[m + 1 :]
            break
    name = None
    depth = 0
    for t in seg:
        if t.text == "<":
            if depth == 0 and name:
                break
            depth += 1
        elif t.text == ">":
            depth -= 1
        elif depth == 0 and t.kind == "ident" and t.text not in ("dyn", "mut", "const"):
            name = t.text
    return name or "impl"


def _strip_raw(text):
    return text[2:] if text.startswith("r#") else text


def parse_file(src):
    """Parse one Rust file into a ParsedFile. Raises ParseError on unbalanced delimiters."""
    return _FileParser(src).parse()


class _FileParser:
    """One file's tokens, walked once for items (functions, modules, test code) and once for
    module references."""

    def __init__(self, src):
        all_toks = tokenize(src)
        self.toks = [t for t in all_toks if t.kind != "comment"]
        self.comments = [t for t in all_toks if t.kind == "comment"]
        self.n = len(self.toks)
        self.pf = ParsedFile()
        self.pf.total_lines = src.count("\n") + (0 if src.endswith("\n") or not src else 1)
        self.match = self._match_delimiters()
        self.attrs_by_end = self._attributes()
        self.test_tok = [False] * self.n  # token inside a #[cfg(test)] / #[test] item
        self.mod_spans = {}  # inline `mod x {`: brace index -> (closing index, name)
        self.fn_items = []  # (fn index, name, enclosing names, item start index, body index)

    def parse(self):
        self._items()
        self._test_lines()
        self._functions()
        self._references()
        return self.pf

    # -- delimiters and attributes ------------------------------------------------------------

    def _match_delimiters(self):
        match = {}
        stack = []
        pairs = {")": "(", "]": "[", "}": "{"}
        for idx, t in enumerate(self.toks):
            if t.kind != "punct":
                continue
            if t.text in "([{":
                stack.append(idx)
            elif t.text in ")]}":
                if not stack or self.toks[stack[-1]].text != pairs[t.text]:
                    raise ParseError("unbalanced %r on line %d" % (t.text, t.line))
                o = stack.pop()
                match[o] = idx
                match[idx] = o
        if stack:
            t = self.toks[stack[-1]]
            raise ParseError("unclosed %r from line %d" % (t.text, t.line))
        return match

    def _attributes(self):
        """Closing `]` index -> (`#` index, inner?, is_test) of every attribute."""
        toks = self.toks
        out = {}
        for idx, t in enumerate(toks):
            if t.text != "#" or t.kind != "punct":
                continue
            k = idx + 1
            inner = k < self.n and toks[k].text == "!"
            if inner:
                k += 1
            if k < self.n and toks[k].text == "[":
                end = self.match[k]
                out[end] = (idx, inner, not inner and _attr_is_test(toks, idx, end))
        return out

    # -- helpers --------------------------------------------------------------------------------

    def _lookback(self, k):
        """Qualifiers and outer attributes before the item keyword at k.
        Returns (item start index, is_test, index of the token before the item)."""
        toks = self.toks
        j = k - 1
        while j >= 0:
            t = toks[j]
            if t.kind == "ident" and t.text in QUALIFIERS:
                j -= 1
            elif t.kind == "lit" and j > 0 and toks[j - 1].text == "extern":
                j -= 1  # extern "C"
            elif t.text == ")" and self.match[j] > 0 and toks[self.match[j] - 1].text == "pub":
                j = self.match[j] - 1  # pub(crate), pub(in path)
            else:
                break
        start = j + 1
        is_test = False
        while j in self.attrs_by_end and not self.attrs_by_end[j][1]:
            s, _, test = self.attrs_by_end[j]
            is_test = is_test or test
            start = s
            j = s - 1
        return start, is_test, j

    def _at_item_position(self, prev):
        """Can an item start after token `prev`? (Not `-> impl Trait`, `*const T`, `<const N>`.)"""
        if prev < 0:
            return True
        t = self.toks[prev]
        return (t.kind == "punct" and t.text in (";", "{", "}")) or prev in self.attrs_by_end

    def _block_or_semi(self, k, allow_block=True):
        """From k, the first `{` (if allow_block) or `;` outside ( ) and [ ] (and { } when not
        allow_block); None at the end of the enclosing group."""
        toks = self.toks
        m = k
        while m < self.n:
            t = toks[m]
            if t.kind == "punct":
                if t.text in "([" or (t.text == "{" and not allow_block):
                    m = self.match[m] + 1
                    continue
                if t.text in "{;":
                    return m
                if t.text in ")]}":
                    return None
            m += 1
        return None

    # -- items ----------------------------------------------------------------------------------

    def _items(self):
        """One walk over the tokens with a stack of enclosing blocks: functions, `mod`
        declarations, inline modules, and the token spans of test items."""
        toks = self.toks
        pending = {}  # opening brace index -> context of the block it opens
        ctx = []  # enclosing blocks: dict(kind, name)
        for idx, t in enumerate(toks):
            if t.kind == "punct" and t.text == "{":
                ctx.append(pending.pop(idx, None) or {"kind": "other", "name": None})
            elif t.kind == "punct" and t.text == "}":
                ctx.pop()
            elif t.kind == "ident" and (t.text in BLOCK_ITEMS or t.text in SEMI_ITEMS):
                start, is_test, prev = self._lookback(idx)
                end = self._item(idx, start, is_test, self._at_item_position(prev), ctx, pending)
                if is_test and end is not None:
                    for m in range(start, end + 1):
                        self.test_tok[m] = True

    def _item(self, idx, start, is_test, positioned, ctx, pending):
        """The item whose keyword is at idx: record it, return the index of its last token
        (None if it is not an item)."""
        toks = self.toks
        kw = toks[idx].text
        nxt = toks[idx + 1] if idx + 1 < self.n else None
        named = nxt is not None and nxt.kind == "ident"
        if kw == "fn":
            if not named:
                return None  # fn(u8) -> u8, a pointer type
            body = self._block_or_semi(idx + 2)
            if body is None or toks[body].text == ";":
                return body  # a declaration without a body (trait, extern block)
            name = _strip_raw(nxt.text)
            enclosing = [c["name"] for c in ctx if c["kind"] in ("mod", "impl", "trait", "fn")]
            pending[body] = {"kind": "fn", "name": name}
            self.fn_items.append((idx, name, enclosing, start, body))
            return self.match[body]
        if kw == "mod":
            if not named:
                return None
            body = self._block_or_semi(idx + 2)
            name = _strip_raw(nxt.text)
            inline_path = tuple(c["name"] for c in ctx if c["kind"] == "mod")
            if body is None:
                return None
            if toks[body].text == "{":
                pending[body] = {"kind": "mod", "name": name}
                self.mod_spans[body] = (self.match[body], name)
                return self.match[body]
            is_test = is_test or self.test_tok[idx]  # its own attributes, or inside a test item
            self.pf.mod_decls.append(ModDecl(name, inline_path, nxt.line, is_test))
            return body
        if not positioned:
            return None
        if kw in ("impl", "trait"):
            if kw == "trait" and not named:
                return None
            body = self._block_or_semi(idx + 1)
            if body is None or toks[body].text != "{":
                return body  # trait alias
            name = _impl_name(toks, idx, body) if kw == "impl" else _strip_raw(nxt.text)
            pending[body] = {"kind": kw, "name": name}
            return self.match[body]
        if kw in ("struct", "enum", "union"):
            if not named:
                return None
            body = self._block_or_semi(idx + 2)
            if body is not None and toks[body].text == "{":
                return self.match[body]
            return body
        if kw == "const" and nxt is not None and nxt.text in CONST_QUALIFIES:
            return None  # a qualifier of the fn that follows, or a const block
        return self._block_or_semi(idx + 1, allow_block=False)

    def _test_lines(self):
        """Lines of test items (the whole span, blank lines and comments inside included)."""
        toks = self.toks
        m = 0
        while m < self.n:
            if self.test_tok[m]:
                s = m
                while m + 1 < self.n and self.test_tok[m + 1]:
                    m += 1
                self.pf.test_lines.update(range(toks[s].line, toks[m].end_line + 1))
            m += 1

    def _functions(self):
        """Functions with their length and their long-fn comment, if any: a comment in the
        contiguous run of comment and attribute lines that ends at the `fn` line."""
        toks = self.toks
        for fidx, name, enclosing, start, body in self.fn_items:
            fn_line = toks[fidx].line
            prev_line = toks[start - 1].end_line if start > 0 else 0
            covered = set()
            for m in range(start, fidx + 1):
                covered.update(range(toks[m].line, toks[m].end_line + 1))
            region = [c for c in self.comments if c.line > prev_line and c.end_line <= fn_line]
            for c in region:
                covered.update(range(c.line, c.end_line + 1))
            top = fn_line
            while top - 1 in covered:
                top -= 1
            allowed = None
            for c in region:
                if c.line >= top and LONG_FN_RE.search(c.text):
                    allowed = c.text.strip()
                    break
            qualname = "::".join([q for q in enclosing if q] + [name])
            end_line = toks[self.match[body]].line
            self.pf.functions.append(
                Function(name, qualname, fn_line, end_line, self.test_tok[fidx], allowed)
            )

    # -- references -------------------------------------------------------------------------

    def _inline_path_at(self, k):
        """Names of the inline modules around token k."""
        return tuple(name for o, (close, name) in sorted(self.mod_spans.items()) if o < k < close)

    def _segment(self, k):
        """The path segment at k (`$crate` read as `crate`) and the index after it."""
        t = self.toks[k]
        if t.text == "$" and k + 1 < self.n and self.toks[k + 1].text == "crate":
            return "crate", k + 2
        if t.kind == "ident":
            return _strip_raw(t.text), k + 1
        return None, k

    def _use_tree(self, k, prefix, out):
        """Parse the use tree at k below `prefix`; append (segments, line) of each leaf to out
        (`self` in braces is the prefix itself); return the index after the tree."""
        toks = self.toks
        segs = list(prefix)
        if k < self.n and toks[k].text == "::":  # `use ::std::x`: an extern crate
            k += 1
            segs.append("::")
        while k < self.n:
            t = toks[k]
            if t.text == "{":
                close = self.match[k]
                k += 1
                while k < close:
                    k = self._use_tree(k, segs, out)
                    if k < close and toks[k].text == ",":
                        k += 1
                return close + 1
            if t.text == "*":
                out.append((segs, t.line))
                return k + 1
            s, k2 = self._segment(k)
            if s is None:
                return k
            if not (s == "self" and prefix and len(segs) == len(prefix)):
                segs.append(s)
            k = k2
            if k < self.n and toks[k].text == "::":
                k += 1
                continue
            if k < self.n and toks[k].text == "as":
                k += 2
            out.append((segs, t.line))
            return k
        return k

    def _references(self):
        """Non-test paths starting with crate / super / self / $crate: `use` trees, and paths
        in code (`crate::a::f()`, `super::b::T`). Comments and literals are not tokens."""
        toks = self.toks
        idx = 0
        while idx < self.n:
            t = toks[idx]
            is_use = t.kind == "ident" and t.text == "use"
            if is_use and not (idx + 1 < self.n and toks[idx + 1].text == "<"):  # not use<'a>
                semi = self._block_or_semi(idx + 1, allow_block=False)
                out = []
                self._use_tree(idx + 1, [], out)
                if not self.test_tok[idx]:
                    ip = self._inline_path_at(idx)
                    for segs, line in out:
                        if segs and segs[0] in PATH_STARTS:
                            self.pf.refs.append(Ref(segs, ip, line))
                idx = (semi if semi is not None else idx) + 1
                continue
            s, k = self._segment(idx)
            after_sep = idx > 0 and toks[idx - 1].text == "::"
            if s in PATH_STARTS and k < self.n and toks[k].text == "::" and not after_sep:
                segs = [s]
                line = t.line
                while k + 1 < self.n and toks[k].text == "::" and toks[k + 1].kind == "ident":
                    segs.append(_strip_raw(toks[k + 1].text))
                    line = toks[k + 1].line
                    k += 2
                if not self.test_tok[idx]:
                    self.pf.refs.append(Ref(segs, self._inline_path_at(idx), line))
                idx = k
                continue
            idx += 1


# --------------------------------------------------------------------------------------------
# Workspace: files, module trees, violations
# --------------------------------------------------------------------------------------------


def is_test_path(rel):
    """Test code by its path: tests.rs, or under tests/, benches/, examples/."""
    parts = rel.replace(os.sep, "/").split("/")
    if parts[-1] == "tests.rs":
        return True
    return any(p in ("tests", "benches", "examples") for p in parts[:-1])


class Module:
    def __init__(self, path, file, is_test):
        self.path = path  # tuple of names from the root
        self.file = file  # repo-relative path
        self.is_test = is_test
        self.children = {}  # name -> Module (file-based, non-inline)


class Root:
    def __init__(self, crate, file, label):
        self.crate = crate
        self.file = file
        self.label = label  # e.g. crates/pdrouter/src, or crates/x/src/bin/y.rs for a binary
        self.modules = {}  # path tuple -> Module


class Workspace:
    def __init__(self, root):
        self.root = root
        self.parsed = {}  # rel path -> ParsedFile
        self.errors = []
        self.roots = []
        self.test_files = set()
        self.src_files = []

    def rel(self, p):
        return os.path.relpath(p, self.root).replace(os.sep, "/")

    def parse(self, rel):
        if rel not in self.parsed:
            with open(os.path.join(self.root, rel), encoding="utf-8") as f:
                src = f.read()
            try:
                self.parsed[rel] = parse_file(src)
            except ParseError as e:
                self.errors.append("%s: %s" % (rel, e))
                self.parsed[rel] = None
        return self.parsed[rel]

    def load(self):
        crates_dir = os.path.join(self.root, "crates")
        for crate in sorted(os.listdir(crates_dir)):
            src = os.path.join(crates_dir, crate, "src")
            if not os.path.isdir(src):
                continue
            for dirpath, dirnames, filenames in os.walk(src):
                dirnames.sort()
                for fn in sorted(filenames):
                    if fn.endswith(".rs"):
                        self.src_files.append(self.rel(os.path.join(dirpath, fn)))
            crate_rel = "crates/%s/src" % crate
            if os.path.isfile(os.path.join(src, "lib.rs")):
                self.roots.append(Root(crate, crate_rel + "/lib.rs", crate_rel))
            if os.path.isfile(os.path.join(src, "main.rs")):
                self.roots.append(Root(crate, crate_rel + "/main.rs", crate_rel + "/main.rs"))
            bindir = os.path.join(src, "bin")
            if os.path.isdir(bindir):
                for fn in sorted(os.listdir(bindir)):
                    p = os.path.join(bindir, fn)
                    if fn.endswith(".rs") and os.path.isfile(p):
                        r = self.rel(p)
                        self.roots.append(Root(crate, r, r))
                    elif os.path.isfile(os.path.join(p, "main.rs")):
                        r = self.rel(os.path.join(p, "main.rs"))
                        self.roots.append(Root(crate, r, r))
        for root in self.roots:
            self.build_tree(root)
        for rel in self.src_files:
            if is_test_path(rel):
                self.test_files.add(rel)
            self.parse(rel)

    def build_tree(self, root):
        top = Module((), root.file, False)
        root.modules[()] = top
        todo = [(top, True)]
        while todo:
            mod, is_root = todo.pop()
            pf = self.parse(mod.file)
            if pf is None:
                continue
            d = os.path.dirname(mod.file)
            base = os.path.basename(mod.file)
            if is_root or base == "mod.rs":
                child_dir = d
            else:
                child_dir = os.path.join(d, base[: -len(".rs")])
            for decl in pf.mod_decls:
                cdir = os.path.join(child_dir, *decl.inline_path) if decl.inline_path else child_dir
                cands = [
                    os.path.join(cdir, decl.name + ".rs"),
                    os.path.join(cdir, decl.name, "mod.rs"),
                ]
                found = [c for c in cands if os.path.isfile(os.path.join(self.root, c))]
                if not found:
                    self.errors.append(
                        "%s:%d: no file for `mod %s;`" % (mod.file, decl.line, decl.name)
                    )
                    continue
                cfile = found[0].replace(os.sep, "/")
                is_test = mod.is_test or decl.is_test or is_test_path(cfile)
                child = Module(mod.path + decl.inline_path + (decl.name,), cfile, is_test)
                if is_test:
                    self.test_files.add(cfile)
                root.modules[child.path] = child
                if not decl.inline_path:
                    mod.children[decl.name] = child
                todo.append((child, False))

    # -- rules --------------------------------------------------------------------------------

    def big_files(self):
        out = []
        for rel in self.src_files:
            pf = self.parsed.get(rel)
            if pf is None or rel in self.test_files:
                continue
            # The whole file counts, an inline test module included: a large one goes to
            # its own `tests.rs`, so the file a reader opens stays within the limit.
            if pf.total_lines > MAX_FILE_LINES:
                out.append((rel, pf.code_lines, pf.total_lines))
        return out

    def functions(self):
        """(rel, Function) of every non-test function over the limit, allowed ones included."""
        out = []
        for rel in self.src_files:
            pf = self.parsed.get(rel)
            if pf is None or rel in self.test_files:
                continue
            for f in pf.functions:
                if not f.is_test and f.length > MAX_FN_LINES:
                    out.append((rel, f))
        return out

    def level_label(self, root, parent_path):
        if not parent_path:
            return root.label
        if root.label.endswith(".rs"):
            return root.label + "::" + "::".join(parent_path)
        return root.label + "/" + "/".join(parent_path)

    def edges(self, root):
        """{parent path: {(a, b): [(file, line), ...]}} sibling edges of one root's tree."""
        out = defaultdict(lambda: defaultdict(list))
        for path, mod in sorted(root.modules.items()):
            if mod.is_test:
                continue
            pf = self.parsed.get(mod.file)
            if pf is None:
                continue
            for ref in pf.refs:
                target = resolve(ref.segments, path + ref.inline_path)
                if target is None:
                    continue
                d = 0
                while d < len(path) and d < len(target) and path[d] == target[d]:
                    d += 1
                if d == len(path) or d >= len(target):
                    continue  # into the file's own subtree, or to an ancestor's own items
                parent = root.modules.get(path[:d])
                if parent is None:
                    continue
                tgt = parent.children.get(target[d])
                if tgt is None or tgt.is_test:
                    continue  # an item of the parent's own file (or an inline module)
                out[path[:d]][(path[d], target[d])].append((mod.file, ref.line))
        return out

    def cycles(self):
        """[(label, [modules], [(a, b, file, line)])] for every SCC of more than one module."""
        result = []
        for root in self.roots:
            for parent, edges in sorted(self.edges(root).items()):
                graph = defaultdict(set)
                for a, b in edges:
                    graph[a].add(b)
                for scc in tarjan(graph):
                    if len(scc) < 2:
                        continue
                    members = sorted(scc)
                    detail = []
                    for (a, b), where in sorted(edges.items()):
                        if a in scc and b in scc:
                            f, ln = min(where)
                            detail.append((a, b, f, ln, len(where)))
                    result.append((self.level_label(root, parent), members, detail))
        result.sort(key=lambda c: (c[0], c[1]))
        return result


def resolve(segments, module_path):
    """Absolute module path of a crate/super/self path used in module `module_path`."""
    if not segments:
        return None
    first = segments[0]
    if first == "crate":
        return tuple(segments[1:])
    if first in ("super", "self"):
        base = list(module_path)
        i = 0
        if first == "self":
            i = 1
        while i < len(segments) and segments[i] == "super":
            if not base:
                return None
            base.pop()
            i += 1
        return tuple(base) + tuple(segments[i:])
    return None


def tarjan(graph):
    nodes = sorted(set(graph) | {b for bs in graph.values() for b in bs})
    index = {}
    low = {}
    on = set()
    stack = []
    out = []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on.discard(w)
                scc.add(w)
                if w == v:
                    break
            out.append(scc)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


# --------------------------------------------------------------------------------------------
# Violations and the baseline
# --------------------------------------------------------------------------------------------


class Violation:
    def __init__(self, kind, key, detail, members=None, label=None):
        self.kind = kind
        self.key = key
        self.detail = detail  # list of report lines
        self.members = members
        self.label = label


def collect(ws):
    vs = []
    for rel, code, total in ws.big_files():
        extra = "" if code == total else " (%d with tests)" % total
        vs.append(Violation("size", "size %s" % rel, ["%s: %d lines%s" % (rel, code, extra)]))
    for rel, f in ws.functions():
        if f.allowed:
            continue
        vs.append(
            Violation(
                "fn",
                "fn %s %s" % (rel, f.qualname),
                [
                    "%s:%d %s: %d lines (to line %d)"
                    % (rel, f.line, f.qualname, f.length, f.end_line)
                ],
            )
        )
    for label, members, detail in ws.cycles():
        lines = ["%s: %s" % (label, ", ".join(members))]
        for a, b, f, ln, count in detail:
            refs = "" if count == 1 else "  (%d references)" % count
            lines.append("    %s -> %s  %s:%d%s" % (a, b, f, ln, refs))
        key = "cycle %s: %s" % (label, ",".join(members))
        vs.append(Violation("cycle", key, lines, set(members), label))
    return vs


CYCLE_KEY_RE = re.compile(r"^cycle (\S+): (\S+)$")


def read_baseline(path):
    entries = []
    errors = []
    if not os.path.exists(path):
        return entries, errors
    with open(path, encoding="utf-8") as f:
        for no, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            line = " ".join(line.split())
            kind = line.split(" ", 1)[0]
            if kind == "cycle":
                m = CYCLE_KEY_RE.match(line)
                if not m:
                    errors.append("%s:%d: bad cycle entry %r" % (path, no, line))
                    continue
                members = sorted(m.group(2).split(","))
                key = "cycle %s: %s" % (m.group(1), ",".join(members))
                entries.append(("cycle", key, m.group(1), set(members)))
            elif (kind, len(line.split())) in (("size", 2), ("fn", 3)):
                entries.append((kind, line, None, None))
            else:
                errors.append("%s:%d: bad entry %r" % (path, no, line))
    return entries, errors


def compare(violations, entries):
    """(new violations, stale baseline keys)."""
    new = []
    stale = []
    have = Counter(e[1] for e in entries if e[0] != "cycle")
    now = Counter(v.key for v in violations if v.kind != "cycle")
    seen = Counter()
    for v in violations:
        if v.kind == "cycle":
            continue
        seen[v.key] += 1
        if seen[v.key] > have[v.key]:
            new.append(v)
    for key, count in sorted(have.items()):
        for _ in range(count - now[key]):
            stale.append(key)
    cycle_entries = [e for e in entries if e[0] == "cycle"]
    used = set()
    for v in violations:
        if v.kind != "cycle":
            continue
        covering = [i for i, e in enumerate(cycle_entries) if e[2] == v.label and v.members <= e[3]]
        if covering:
            used.update(covering)
        else:
            new.append(v)
    for i, e in enumerate(cycle_entries):
        if i not in used:
            stale.append(e[1])
    return new, stale


BASELINE_HEADER = """\
# Known layout violations (scripts/check_layout.py). This list may only shrink: fix a
# violation and delete its line; the check fails on a line that no longer matches.
# Regenerate with `python3 scripts/check_layout.py --write-baseline` only to drop entries.
"""


def write_baseline(path, violations):
    order = {"size": 0, "fn": 1, "cycle": 2}
    keys = sorted((v.key for v in violations), key=lambda k: (order[k.split(" ", 1)[0]], k))
    with open(path, "w", encoding="utf-8") as f:
        f.write(BASELINE_HEADER)
        for k in keys:
            f.write(k + "\n")


def summary(violations, tail):
    c = Counter(v.kind for v in violations)
    return "layout: %d files over %d lines, %d functions over %d lines, %d cycles; %s" % (
        c["size"],
        MAX_FILE_LINES,
        c["fn"],
        MAX_FN_LINES,
        c["cycle"],
        tail,
    )


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(here), help="workspace root")
    ap.add_argument(
        "--baseline", default=None, help="baseline file (default scripts/layout-baseline.txt)"
    )
    g = ap.add_mutually_exclusive_group()
    g.add_argument(
        "--report", action="store_true", help="print every violation with details, exit 0"
    )
    g.add_argument(
        "--write-baseline", action="store_true", help="rewrite the baseline from the tree"
    )
    args = ap.parse_args(argv)
    baseline = args.baseline or os.path.join(args.root, "scripts", "layout-baseline.txt")

    ws = Workspace(args.root)
    ws.load()
    if ws.errors:
        for e in ws.errors:
            print("layout: cannot parse: %s" % e, file=sys.stderr)
        return 2
    violations = collect(ws)

    if args.write_baseline:
        write_baseline(baseline, violations)
        print(summary(violations, "baseline written to %s" % os.path.relpath(baseline)))
        return 0

    entries, errors = read_baseline(baseline)
    new, stale = compare(violations, entries)
    new_keys = {id(v) for v in new}

    if args.report:
        sections = [
            ("size", "Files over %d lines (test code not counted):" % MAX_FILE_LINES),
            ("fn", "Functions over %d lines:" % MAX_FN_LINES),
            ("cycle", "Module cycles (parent: modules; one example reference per edge):"),
        ]
        for kind, title in sections:
            print(title)
            items = [v for v in violations if v.kind == kind]
            if not items:
                print("  none")
            for v in items:
                mark = "  [new]" if id(v) in new_keys else ""
                print("  " + v.detail[0] + mark)
                for more in v.detail[1:]:
                    print("  " + more)
            print()
        allowed = [(rel, f) for rel, f in ws.functions() if f.allowed]
        if allowed:
            print("Functions over %d lines allowed by a long-fn comment:" % MAX_FN_LINES)
            for rel, f in allowed:
                print("  %s:%d %s: %d lines" % (rel, f.line, f.qualname, f.length))
            print()
        for e in errors:
            print(e)
        for k in stale:
            print("stale baseline entry: %s" % k)
        print(summary(violations, baseline_state(new, stale, errors)))
        return 0

    for e in errors:
        print(e)
    for v in new:
        print("new: " + v.key)
        for d in v.detail:
            print("    " + d)
    for k in stale:
        print("stale baseline entry (delete it): %s" % k)
    print(summary(violations, baseline_state(new, stale, errors)))
    return 1 if new or stale or errors else 0


def baseline_state(new, stale, errors):
    if not new and not stale and not errors:
        return "baseline ok"
    parts = []
    if new:
        parts.append("%d not in the baseline" % len(new))
    if stale:
        parts.append("%d stale baseline entries" % len(stale))
    if errors:
        parts.append("%d bad baseline lines" % len(errors))
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
