#!/usr/bin/env python3
"""Check the relative links of the repository's Markdown files.

Scans README.md, ARCHITECTURE.md, docs/*.md and every other *.md file in the repository
(outside target/, virtual environments and crates/*/tests/fixtures). For each relative link
(inline `[text](target)`, images, reference definitions, and HTML href/src attributes) it
checks that the target file or directory exists and that a `#anchor`, in the same file or in
another Markdown file, names a heading there: its GitHub-style slug (lowercase, spaces become
'-', punctuation other than '-' and '_' removed, repeated headings get -1, -2, ...) or an
explicit <a id/name="...">. Links with a URL scheme (http:, https:, mailto:, ...) and links
inside fenced code blocks or inline code are ignored.

Prints every broken link as `file:line: target` and exits 1 if there is any, else 0.
Standard library only; run from anywhere: `python3 scripts/check_links.py`.
"""

import os
import re
import sys
from urllib.parse import unquote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", "target", "node_modules"}

FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_RE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
INLINE_CODE_RE = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)*?)(?<!`)\1(?!`)", re.S)
INLINE_LINK_RE = re.compile(
    r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^)\s]+)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REF_DEF_RE = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]*(<[^>]*>|\S+)", re.M)
HTML_LINK_RE = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']*)[\"']", re.I)
HTML_ANCHOR_RE = re.compile(r"<a\b[^>]*?\b(?:name|id)\s*=\s*[\"']([^\"']*)[\"']", re.I)
SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files():
    """Every *.md file to check, as paths relative to the repository root, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        keep = []
        for d in dirnames:
            rel = os.path.normpath(os.path.join(rel_dir, d))
            parts = rel.split(os.sep)
            if d in SKIP_DIRS or os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg")):
                continue
            # crates/<crate>/tests/fixtures
            if len(parts) == 4 and parts[0] == "crates" and parts[2:] == ["tests", "fixtures"]:
                continue
            keep.append(d)
        dirnames[:] = sorted(keep)
        for f in filenames:
            if f.endswith(".md"):
                found.append(os.path.normpath(os.path.join(rel_dir, f)))
    return sorted(found)


def blank_code(text):
    """The text with fenced code blocks and inline code spans replaced by spaces.

    Newlines are kept, so offsets and line numbers stay those of the original text.
    """
    out = []
    fence = None
    for line in text.split("\n"):
        m = FENCE_RE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                out.append("")
                continue
            out.append(line)
        else:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and line.strip() == m.group(1):
                fence = None
            out.append("")
    text = "\n".join(out)
    return INLINE_CODE_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def anchors(text):
    """Every anchor a Markdown file defines."""
    result = set()
    counts = {}
    fence = None
    prev = ""
    for line in text.split("\n"):
        m = FENCE_RE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and line.strip() == m.group(1):
                fence = None
            prev = ""
            continue
        if m:
            fence = m.group(1)
            prev = ""
            continue
        heading = None
        atx = ATX_RE.match(line)
        if atx:
            heading = atx.group(2) or ""
        elif SETEXT_RE.match(line) and prev.strip() and not re.match(r"^ {0,3}([#|>*+-]|\d+[.)])", prev):
            heading = prev.strip()
        if heading is not None:
            base = slug(heading)
            n = counts.get(base, 0)
            counts[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
            prev = ""
            continue
        result.update(HTML_ANCHOR_RE.findall(line))
        prev = line
    return result


def links(text):
    """(line, target) of every link outside code."""
    clean = blank_code(text)
    found = []
    for regex in (INLINE_LINK_RE, REF_DEF_RE, HTML_LINK_RE):
        for m in regex.finditer(clean):
            target = m.group(1)
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            line = clean.count("\n", 0, m.start(1)) + 1
            found.append((line, target))
    return sorted(found)


def main():
    files = markdown_files()
    cache = {}

    def anchors_of(path):
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = anchors(f.read())
        return cache[path]

    broken = []
    for rel in files:
        path = os.path.join(ROOT, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for line, target in links(text):
            if not target or SCHEME_RE.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            file_part = unquote(file_part.split("?", 1)[0])
            if file_part:
                base = ROOT if file_part.startswith("/") else os.path.dirname(path)
                dest = os.path.normpath(os.path.join(base, file_part.lstrip("/")))
            else:
                dest = path
            ok = os.path.exists(dest)
            if ok and anchor and dest.endswith(".md") and os.path.isfile(dest):
                ok = unquote(anchor) in anchors_of(dest)
            if not ok:
                broken.append(f"{rel}:{line}: {target}")
    for b in broken:
        print(b)
    if broken:
        print(f"check_links: {len(broken)} broken link(s) in {len(files)} file(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
