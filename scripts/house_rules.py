#!/usr/bin/env python3
"""The house rules that a script can check (docs/ARCHITECTURE.md, "The house"):

- no Rust file over 1,200 lines outside tests (`tests/` folders and `#[cfg(test)]` test
  modules are not counted);
- no `#[allow(clippy::too_many_arguments)]`: what travels together is a struct;
- no import circle between the files of one crate.

On imports: File A uses file B when it names an item of B by path (`crate::b::..` or
`super::b::..`, in `use` or in code; unit tests left out). A room may use the module it is a
room of (a child file its parent or any ancestor): that is one module in several files, not a
circle. Every other loop of uses is a circle.

Prints what breaks a rule (each circle with the uses that make it) and exits 1; a circle in
KNOWN below is allowed, and a known circle that changed (or is gone) fails too, so the list
stays true.
"""

import os
import re
import sys

# Circles not broken yet, each with the reason: keep this list short and true (empty now).
KNOWN = set()

USE = re.compile(r"\b(crate|super)((?:::\w+)+)")
UNIT_TESTS = re.compile(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", re.S)
LINE_COMMENT = re.compile(r"//[^\n]*")


def module_of(src, path):
    parts = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def uses_of(module, text, modules):
    """The modules (files) `module` names items of, with the paths it names them by."""
    text = LINE_COMMENT.sub("", UNIT_TESTS.sub("", text))
    found = {}
    for m in USE.finditer(text):
        base = () if m.group(1) == "crate" else module[:-1]
        parts = m.group(2).strip(":").split("::")
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
        path = base + tuple(parts)
        target = next((path[:k] for k in range(len(path), -1, -1) if path[:k] in modules), None)
        if target is None or target == module or module[: len(target)] == target:
            continue  # itself, or a room using its own module
        found.setdefault(target, m.group(0))
    return found


def circles(edges):
    """Strongly connected parts of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(part)

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


LINES_MAX = 1200
NO_ALLOW = "#[allow(clippy::too_many_arguments)]"


def sizes_and_allowances(root):
    """Files over LINES_MAX (without their unit tests) and files with NO_ALLOW; True if any."""
    failed = False
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("target", "tests", ".git", ".venv", "node_modules")]
        for f in names:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(d, f)
            text = open(path).read()
            lines = UNIT_TESTS.sub("", text).count("\n")
            if lines > LINES_MAX:
                failed = True
                print(f"{os.path.relpath(path, root)}: {lines} lines (at most {LINES_MAX} outside tests)")
            if NO_ALLOW in text:
                failed = True
                print(f"{os.path.relpath(path, root)}: {NO_ALLOW} (pass a struct instead)")
    return failed


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    failed = sizes_and_allowances(root)
    seen = set()
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if not (os.path.isfile(os.path.join(root, crate, "Cargo.toml")) and os.path.isdir(src)):
            continue
        files = {}
        for d, _, names in os.walk(src):
            for f in names:
                if f.endswith(".rs"):
                    files[module_of(src, os.path.join(d, f))] = os.path.join(d, f)
        uses = {m: uses_of(m, open(p).read(), files) for m, p in files.items()}
        edges = {m: set(u) for m, u in uses.items()}
        for part in circles(edges):
            name = tuple(sorted("::".join(m) or "lib" for m in part))
            known = (crate, name) in KNOWN
            seen.add((crate, name))
            failed |= not known
            print(f"{crate}: {' '.join(name)}{' (known)' if known else ''}")
            for a in sorted(part):
                for b in sorted(edges[a] & set(part)):
                    print(f"    {'::'.join(a)} -> {'::'.join(b)}  ({uses[a][b]})")
    for crate, name in sorted(KNOWN - seen):
        failed = True
        print(f"{crate}: {' '.join(name)} is listed as a known circle but is not one now: "
              "update KNOWN in scripts/house_rules.py")
    if failed:
        print("house rules broken: see docs/ARCHITECTURE.md, \"The house\"", file=sys.stderr)
        return 1
    print(f"house rules hold: no file over {LINES_MAX} lines, no too_many_arguments, "
          "no import circles but the known ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
