#!/usr/bin/env python3
"""The file-level import graph of a crate and its circles; exits 1 on a circle of more than one file.

Usage: module_cycles.py [--graph] [CRATE_DIR ...]   (default: crates/agent)

Nodes are the crate's source files (`src/**/*.rs`). An edge A -> B means code in A names an
item that B defines: every `crate::…`, `super::…` and `self::…` path, and every path through a
child module or a `use`-imported name, in `use` declarations and in expressions alike, resolved
to the file that defines the item:

- module segments are followed down the module tree (`a.rs`, `a/mod.rs` or `a.rs` beside `a/`);
- the item after the last module is looked up in that module's file; a name the file only
  re-exports (`pub use x::Name`, `pub use x::*`) is followed to where it is defined, so a folder's
  `mod.rs` that gathers its files' names counts as those files;
- a path that names a module (`use crate::chat;`) points at the module's own file;
- a re-export (`pub use` …) is not itself an edge: it names, it does not call;
- `mod` declarations are not edges; comments (doc links too) and string literals are ignored;
  inline modules (`mod tests { … }`) belong to their file.

The strongly connected components of that graph with more than one file are the import circles.
For each, the script prints one circle through it, each step with the line that makes it.
`--graph` also prints every edge.
"""
import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ITEM_KINDS = r"(?:struct|enum|union|trait|type|fn|const|static|mod|macro_rules!)"
ITEM_DEF = re.compile(
    r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:(?:async|const|unsafe|extern\s+\"[^\"]*\")\s+)*"
    + ITEM_KINDS
    + r"\s+(" + IDENT + r")",
    re.M,
)
USE_DECL = re.compile(r"\b(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]*);", re.S)
MOD_DECL = re.compile(r"^[ \t]*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", re.M)
INLINE_MOD = re.compile(r"\bmod\s+(" + IDENT + r")\s*\{")
PATH = re.compile(r"(?<![A-Za-z0-9_:])((?:" + IDENT + r")(?:\s*::\s*(?:" + IDENT + r"|\*))+)")


def strip(text):
    """The text with comments and string/char literal contents blanked (same offsets)."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 300]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            start = i + 2 + len(hashes)
            end = text.find('"' + hashes, start)
            end = n if end < 0 else end + 1 + len(hashes)
            blank(start, end - 1 - len(hashes))
            i = end
        elif c == "b" and text.startswith('b"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}', '"') or a lifetime ('a): blank the former.
            m = re.match(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                blank(i + 1, i + len(m.group(0)) - 1)
                i += len(m.group(0))
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def split_top(text, sep=","):
    parts, depth, cur = [], 0, []
    for c in text:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def use_paths(tree, prefix=()):
    """A `use` tree as (segments, alias) pairs; alias None for a glob, the last segment otherwise."""
    tree = re.sub(r"\s+", " ", tree.strip())
    if tree.startswith("::"):
        tree = tree[2:]
    if "{" in tree:
        head, _, rest = tree.partition("{")
        head = head.strip().rstrip(":").strip()
        segs = prefix + tuple(s.strip() for s in head.split("::") if s.strip())
        inner = rest[: rest.rfind("}")]
        result = []
        for part in split_top(inner):
            if part == "self":
                result.append((segs, segs[-1] if segs else None))
            else:
                result.extend(use_paths(part, segs))
        return result
    alias = None
    m = re.match(r"(.*?)\s+as\s+(" + IDENT + r")$", tree)
    if m:
        tree, alias = m.group(1), m.group(2)
    segs = prefix + tuple(s.strip() for s in tree.split("::") if s.strip())
    if segs and segs[-1] == "*":
        return [(segs, None)]
    if segs and segs[-1] == "self":
        segs = segs[:-1]
    return [(segs, alias or (segs[-1] if segs else None))]


class Crate:
    def __init__(self, root):
        self.root = root
        self.src = os.path.join(root, "src")
        self.files = {}  # module path tuple -> relative file
        self.module_of = {}  # relative file -> module path tuple
        for dirpath, _, names in os.walk(self.src):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), self.src)
                parts = rel[:-3].split(os.sep)
                if parts == ["lib"] or parts == ["main"]:
                    module = ()
                elif parts[-1] == "mod":
                    module = tuple(parts[:-1])
                else:
                    module = tuple(parts)
                self.files[module] = rel
                self.module_of[rel] = module
        self.text = {}
        self.code = {}
        self.defs = {}
        self.uses = {}  # file -> [(segments, alias, is_pub, offset)]
        self.inline = {}  # file -> [(name, start, end)]
        for rel in self.module_of:
            with open(os.path.join(self.src, rel), encoding="utf-8") as f:
                self.text[rel] = f.read()
            code = strip(self.text[rel])
            self.code[rel] = code
            self.defs[rel] = set(ITEM_DEF.findall(code))
            uses = []
            for m in USE_DECL.finditer(code):
                for segs, alias in use_paths(m.group(2)):
                    uses.append((segs, alias, bool(m.group(1)), m.start()))
            self.uses[rel] = uses
            self.inline[rel] = self.inline_modules(code)

    @staticmethod
    def inline_modules(code):
        spans = []
        for m in INLINE_MOD.finditer(code):
            depth, j = 1, m.end()
            while j < len(code) and depth:
                depth += {"{": 1, "}": -1}.get(code[j], 0)
                j += 1
            spans.append((m.group(1), m.start(), j))
        return spans

    def line(self, rel, offset):
        return self.text[rel].count("\n", 0, offset) + 1

    def inline_depth(self, rel, offset):
        return sum(1 for _, a, b in self.inline[rel] if a < offset < b)

    def child_module(self, module, name):
        return self.files.get(module + (name,)) is not None

    def resolve(self, rel, segs, offset, seen=frozenset()):
        """The file that defines what `segs`, written at `offset` in `rel`, names; None if outside the crate."""
        return self.lookup(rel, segs, offset, seen)[0]

    def lookup(self, rel, segs, offset, seen):
        """(file, exact): the file defining what `segs` names, and whether the name was found in
        it (False: the path ends in an item its module's file neither defines nor re-exports)."""
        if not segs:
            return None, False
        module = self.module_of[rel]
        depth = self.inline_depth(rel, offset)
        segs = list(segs)
        first = segs[0]
        if first == "crate":
            module, segs = (), segs[1:]
        elif first in ("self", "super"):
            while segs and segs[0] in ("self", "super"):
                if segs[0] == "super":
                    if depth:
                        depth -= 1
                    else:
                        module = module[:-1]
                segs = segs[1:]
            if depth:
                return rel, True  # inside an inline module: its own names are the file's
        elif self.child_module(module, first):
            pass
        else:
            # A name brought in by a `use` of this file (not a glob).
            for useg, alias, _, uoff in self.uses[rel]:
                if alias == first and useg and useg[0] != first:
                    key = (rel, tuple(useg))
                    if key in seen:
                        return None, False
                    return self.lookup(rel, list(useg) + segs[1:], uoff, seen | {key})
            return None, False
        return self.lookup_in(module, segs, seen)

    def lookup_in(self, module, segs, seen):
        while segs and self.child_module(module, segs[0]):
            module, segs = module + (segs[0],), segs[1:]
        rel = self.files.get(module)
        if rel is None:
            return None, False
        if not segs or segs[0] == "*":
            return rel, True
        name = segs[0]
        if name in self.defs[rel]:
            return rel, True
        # Re-exported: follow it to where it is defined.
        for useg, alias, is_pub, uoff in self.uses[rel]:
            if not is_pub:
                continue
            key = (rel, tuple(useg), name)
            if key in seen:
                continue
            if alias == name:
                target, exact = self.lookup(rel, list(useg) + segs[1:], uoff, seen | {key})
                if target:
                    return target, exact
            elif alias is None:  # a glob: only if the name is found through it
                target, exact = self.lookup(rel, list(useg[:-1]) + segs, uoff, seen | {key})
                if target and exact:
                    return target, True
        return rel, False

    def edges(self):
        """{(from, to): (line, path text)} for every edge between two different files."""
        found = {}
        for rel, code in self.code.items():
            spans = []
            for m in USE_DECL.finditer(code):
                spans.append((m.start(), m.end()))
                if m.group(1):
                    continue  # a re-export names; it is followed when something uses the name
                for segs, _ in use_paths(m.group(2)):
                    target = self.resolve(rel, segs, m.start())
                    self.add(found, rel, target, m.start(), "::".join(segs))
            for m in PATH.finditer(code):
                if any(a <= m.start() < b for a, b in spans):
                    continue
                if m.start() > 0 and code[m.start() - 1] == "$":
                    continue  # a macro variable
                segs = [s.strip() for s in m.group(1).split("::")]
                target = self.resolve(rel, segs, m.start())
                self.add(found, rel, target, m.start(), "::".join(segs))
        return found

    def add(self, found, rel, target, offset, text):
        if target and target != rel and (rel, target) not in found:
            found[(rel, target)] = (self.line(rel, offset), text)


def components(nodes, edges):
    """Tarjan's strongly connected components."""
    graph = defaultdict(list)
    for a, b in edges:
        graph[a].append(b)
    index, low, on, stack, result, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            result.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return result


def one_circle(component, edges):
    """A shortest circle through the component's first file, as a list of files."""
    inside = set(component)
    start = component[0]
    graph = defaultdict(list)
    for a, b in sorted(edges):
        if a in inside and b in inside:
            graph[a].append(b)
    previous, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph[v]:
                if w == start:
                    path = [v]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]


def main(argv):
    show_graph = "--graph" in argv
    roots = [a for a in argv if not a.startswith("--")] or ["crates/agent"]
    failed = False
    for root in roots:
        crate = Crate(root)
        edges = crate.edges()
        if show_graph:
            for (a, b), (line, text) in sorted(edges.items()):
                print(f"module cycles: {root}: {a}:{line} -> {b} ({text})")
        circles = [c for c in components(crate.module_of, edges) if len(c) > 1]
        print(
            f"module cycles: {root}: {len(crate.module_of)} files, {len(edges)} edges, "
            f"{len(circles)} circle(s) of more than one file"
        )
        for comp in circles:
            failed = True
            print(f"module cycles: CIRCLE of {len(comp)} files in {root}/src: {', '.join(comp)}", file=sys.stderr)
            circle = one_circle(comp, edges)
            for a, b in zip(circle, circle[1:]):
                line, text = edges[(a, b)]
                print(f"module cycles:   {a}:{line} -> {b}  ({text})", file=sys.stderr)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
