#!/usr/bin/python3
"""Checks the calls between the library's object files against its layers.

Reads, with nm, the symbols each object of the corefit_objects target defines and uses, and
draws an edge from a file to every other library file that defines a symbol it uses. Fails when

  * a file calls into a layer above its own
    (core < tensor < nn < optim < io < data < learn < par < plot), or
  * the files form a circle (a strongly connected group of two or more files) that is not inside
    one of the known circles listed in the allow-list file. The list holds only circles that are
    to be removed: an entry may be dropped, never added.

An object's layer and file come from its path, .../src/<layer>/<file>.c.o.

  layer_deps.py --nm NM --allow FILE OBJECT...
  layer_deps.py --nm NM --allow FILE --self-test CC OBJECT...
      also compiles an upward call and a new circle into extra objects and fails unless the
      check refuses each of them (and passes the real objects alone)
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

# io (model files) sits below data, where CMakeLists.txt's CF_LAYERS lists it: it needs only nn
# (parameter names), and the learner saves, loads and checkpoints models through it.
RANKS = {"core": 0, "tensor": 1, "nn": 2, "optim": 3, "io": 4, "data": 5, "learn": 6, "par": 7,
         "plot": 8}
OBJECT_PATH = re.compile(r"/src/([^/]+)/([^/]+)\.c\.o(bj)?$")
# nm's kinds: global (upper case), weak and unique definitions; lower-case t, d, b, r are local
DEFINED = set("TDBRCGSVWIiu")
UNDEFINED = set("Uwv")


def file_of(obj):
    m = OBJECT_PATH.search(obj)
    if not m:
        raise SystemExit(f"layer_deps: {obj}: not an object of src/<layer>/<file>.c")
    layer = m.group(1)
    if layer not in RANKS:
        raise SystemExit(f"layer_deps: {obj}: layer '{layer}' is not one of {sorted(RANKS)}")
    return f"{layer}/{m.group(2)}.c"


def symbols(nm, objects):
    """{object: (defined, used) global symbol names}, from one run of nm over all objects."""
    out = subprocess.run([nm, "-P", "-A", *objects], check=True, capture_output=True,
                         text=True).stdout
    table = {obj: (set(), set()) for obj in objects}
    for line in out.splitlines():
        obj, sep, rest = line.partition(": ")
        parts = rest.split()
        if not sep or obj not in table or len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind in UNDEFINED:
            table[obj][1].add(name)
        elif kind in DEFINED:
            table[obj][0].add(name)
    return table


def graph(nm, objects):
    """file -> {file it calls: [symbols]}"""
    defs, uses = {}, {}
    where = {}
    for obj, (d, u) in symbols(nm, objects).items():
        f = file_of(obj)
        defs[f], uses[f] = d, u
        for s in d:
            if s in where and where[s] != f:
                raise SystemExit(f"layer_deps: {s} is defined by both {where[s]} and {f}")
            where[s] = f
    edges = {f: {} for f in defs}
    for f, used in uses.items():
        for s in sorted(used):
            g = where.get(s)
            if g and g != f:
                edges[f].setdefault(g, []).append(s)
    return edges


def circles(edges):
    """Strongly connected groups of two or more files (Tarjan), each a sorted tuple."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        # iterative depth-first search: the library has ~100 files, but keep the stack flat
        work = [(v, iter(sorted(edges[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == node:
                        break
                if len(group) > 1:
                    out.append(tuple(sorted(group)))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def read_allow(path):
    """Known circles: one a line, its files separated by spaces; '#' starts a comment."""
    allowed = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            files = line.split()
            for name in files:
                if "/" not in name or name.split("/")[0] not in RANKS:
                    raise SystemExit(f"layer_deps: {path}:{number}: '{name}' is not "
                                     "<layer>/<file>.c")
            allowed.append((number, frozenset(files)))
    return allowed


def check(nm, allow_path, objects, out=sys.stdout):
    """Number of problems found; each is printed."""
    edges = graph(nm, objects)
    problems = 0
    for f in sorted(edges):
        for g, syms in sorted(edges[f].items()):
            lf, lg = f.split("/")[0], g.split("/")[0]
            if RANKS[lg] > RANKS[lf]:
                problems += 1
                print(f"upward call: {f} (layer {lf}) uses {', '.join(syms[:4])}"
                      f"{' ...' if len(syms) > 4 else ''} from {g} (layer {lg}, above it)",
                      file=out)
    allowed = read_allow(allow_path)
    used_entries = set()
    for group in circles(edges):
        inside = [number for number, files in allowed if set(group) <= files]
        if inside:
            used_entries.update(inside)
            continue
        problems += 1
        links = [f"{f} -> {g} ({edges[f][g][0]})" for f in group for g in sorted(edges[f])
                 if g in group]
        print(f"new circle between files: {' '.join(group)}\n    " + "\n    ".join(links),
              file=out)
    for number, files in allowed:
        if number not in used_entries:
            print(f"note: {allow_path}:{number} ({' '.join(sorted(files))}) is no longer a "
                  "circle: remove the line", file=out)
    return problems


INJECTED = {
    # a core file calling the learner: an upward call
    "src/core/injected_upward.c":
        "void cf_learner_free(void *);\nvoid injected_upward(void *l) { cf_learner_free(l); }\n",
    # two tensor files calling each other: a new circle
    "src/tensor/injected_a.c":
        "int injected_b(int);\nint injected_a(int n) { return n ? injected_b(n - 1) : 0; }\n",
    "src/tensor/injected_b.c":
        "int injected_a(int);\nint injected_b(int n) { return n ? injected_a(n - 1) : 1; }\n",
}


def self_test(nm, cc, allow_path, objects):
    with tempfile.TemporaryDirectory(prefix="cf-layer-deps-") as tmp:
        built = {}
        for rel, text in INJECTED.items():
            src = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(src), exist_ok=True)
            with open(src, "w") as f:
                f.write(text)
            subprocess.run([cc, "-c", src, "-o", src + ".o"], check=True)
            built[rel] = src + ".o"
        cases = [
            ("the real objects", [], 0, None),
            ("an upward call", [built["src/core/injected_upward.c"]], 1,
             "upward call: core/injected_upward.c (layer core) uses cf_learner_free from "
             "learn/learner.c"),
            ("a new circle", [built["src/tensor/injected_a.c"], built["src/tensor/injected_b.c"]],
             1, "new circle between files: tensor/injected_a.c tensor/injected_b.c"),
        ]
        failed = 0
        for what, extra, expect, message in cases:
            log = open(os.path.join(tmp, "log"), "w+")
            n = check(nm, allow_path, objects + extra, out=log)
            log.seek(0)
            text = log.read()
            ok = n == expect and (message is None or message in text)
            print(f"{'ok' if ok else 'FAILED'}: {what}: {n} problem(s), expected {expect}")
            if not ok:
                print(text)
                failed += 1
        return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--allow", required=True)
    ap.add_argument("--self-test", metavar="CC")
    ap.add_argument("objects", nargs="+")
    a = ap.parse_args()
    if a.self_test:
        return 1 if self_test(a.nm, a.self_test, a.allow, a.objects) else 0
    n = check(a.nm, a.allow, a.objects)
    print(f"layer_deps: {len(a.objects)} objects, {n} problem(s)")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
