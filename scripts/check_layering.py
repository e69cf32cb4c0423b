#!/usr/bin/env python3
"""Checks that evt's #include lines follow the layering of docs/architecture.md; `make` runs it first.

Rules: a file under src/<module>/ includes only headers of its own module, of the modules LAYERS lists
for it, include/evt.h, kernels/ ABI headers where allowed, and system headers; kernels/ includes nothing of
src/; no two headers include each other, directly or through others. Exit status 1 with one line per
violation: `file:line: module A may not include B (header)`.
Usage: python3 scripts/check_layering.py [ROOT]
"""
import os
import re
import sys

# module -> modules it may include (besides itself and util). Lower layers first.
LAYERS = {
    "util": set(),
    "ir": set(),
    "autodiff": {"ir"},
    "passes": {"ir"},
    "partition": {"ir"},
    "runtime/interp": {"ir", "kernels"},  # kernels/philox.h: the interpreter draws the GPU's dropout masks
    "runtime/jit": set(),
    "codegen": {"partition", "ir", "kernels"},
    "runtime/gpu": {"codegen", "partition", "ir", "kernels"},
    "tune": {"runtime/gpu", "runtime/jit", "codegen", "partition", "ir", "kernels"},
    "compile": {"tune", "runtime/gpu", "runtime/jit", "runtime/interp", "codegen", "partition", "passes",
                "autodiff", "ir", "kernels"},
    "cli": {"compile", "tune", "runtime/gpu", "runtime/jit", "runtime/interp", "codegen", "partition",
            "passes", "autodiff", "ir", "kernels"},
}
# Data tables every layer may read: the op table generates the kernel library's op enum too.
SHARED_TABLES = {"src/ir/ops.def"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def module_of(path):
    """The module of a path relative to the root: 'ir', 'runtime/gpu', 'kernels', or None (not layered)."""
    parts = path.split("/")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] != "src" or len(parts) < 3:
        return None
    if parts[1] == "runtime" and len(parts) >= 4:
        return "runtime/" + parts[2]
    return parts[1]


def resolve(root, src_file, name):
    """The repository path an #include "name" of src_file reaches (the Makefile's -Iinclude -Isrc -Ikernels
    after the including file's own folder), or None for a header outside the repository."""
    for base in (os.path.dirname(src_file), "include", "src", "kernels"):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def sources(root):
    for top in ("src", "kernels"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".c", ".h", ".cu", ".cuh", ".def")):
                    yield os.path.relpath(os.path.join(d, f), root)


def main(root):
    bad = []
    headers = {}
    for path in sorted(sources(root)):
        text = open(os.path.join(root, path), encoding="utf-8").read()
        mod = module_of(path)
        deps = []
        for m in INCLUDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            target = resolve(root, path, m.group(1))
            if target is None or target == "include/evt.h" or target in SHARED_TABLES:
                continue
            deps.append(target)
            tmod = module_of(target)
            if tmod in (mod, "util") and not (mod == "kernels" and tmod != "kernels"):
                continue
            if mod == "kernels" or tmod not in LAYERS.get(mod, set()):
                bad.append(f"{path}:{line}: module {mod} may not include {tmod} ({target})")
        if path.endswith((".h", ".cuh")):
            headers[path] = [d for d in deps if d.endswith((".h", ".cuh"))]
    bad += cycles(headers)
    for b in bad:
        print(b)
    return 1 if bad else 0


def cycles(headers):
    """One line per header include cycle (depth-first search over the header graph)."""
    out, state, stack = [], {}, []

    def visit(h):
        state[h] = 1
        stack.append(h)
        for d in headers.get(h, []):
            if state.get(d) == 1:
                out.append("include cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[h] = 2

    for h in sorted(headers):
        if h not in state:
            visit(h)
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
