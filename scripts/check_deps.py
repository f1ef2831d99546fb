#!/usr/bin/env python3
"""Checks that what a module compiles includes only headers of modules it links.

A module is a folder whose CMakeLists.txt defines libraries (one module folder, one target; a
folder may add an INTERFACE target for its hook headers, or an emulated twin); a file belongs to
the nearest such folder above it. For every object of a library target of a module under the
given roots, every repository header the compiler read (ninja's dependency log of a finished
build, so exactly what the configured build compiles, transitive includes too) must belong to
the same module (or to a module whose sources the library compiles itself) or to a module one of
whose targets that library links, directly or transitively (CMake's link graph,
`cmake --graphviz`).

Usage: scripts/check_deps.py BUILD_DIR [ROOT...]   (roots default: common/engine kvtransfer)
Exit status 1 with one line per offending (target, header); 0 when every include is linked.
"""
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY_RE = re.compile(r'^\s*add_library\(\s*([A-Za-z0-9_]+)', re.M)
OBJECT_LIBRARY_RE = re.compile(r'^\s*add_library\(\s*([A-Za-z0-9_]+)\s+OBJECT\b', re.M)
OBJECT_RE = re.compile(r'^(\S*?)CMakeFiles/([A-Za-z0-9_]+)\.dir/\S+\.o: #deps')


def module_targets():
    """Module folder (relative to the repository) -> the library targets it defines; and the
    OBJECT libraries among them."""
    folders, objects = {}, set()
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames if not d.startswith(('.', 'build')) and
                       d not in ('node_modules', 'tests', 'third_party')]
        if 'CMakeLists.txt' not in filenames:
            continue
        with open(os.path.join(dirpath, 'CMakeLists.txt')) as f:
            text = f.read()
        targets = LIBRARY_RE.findall(text)
        objects.update(OBJECT_LIBRARY_RE.findall(text))
        if targets:
            folders[os.path.relpath(dirpath, REPO)] = set(targets)
    return folders, objects


def owner(path, folders):
    d = os.path.dirname(path)
    while d:
        if d in folders:
            return d
        d = os.path.dirname(d)
    return None


def link_graph(build_dir):
    """Target -> the targets it links directly, and -> every target it links, directly or
    transitively."""
    with tempfile.TemporaryDirectory() as tmp:
        dot = os.path.join(tmp, 'deps.dot')
        subprocess.run(['cmake', f'--graphviz={dot}', '.'], cwd=build_dir, check=True,
                       stdout=subprocess.DEVNULL)
        with open(dot) as f:
            text = f.read()
    names = dict(re.findall(r'"(node\d+)"\s*\[\s*label\s*=\s*"([^"]+)"', text))
    edges = {}
    for a, b in re.findall(r'"(node\d+)"\s*->\s*"(node\d+)"', text):
        edges.setdefault(names[a], set()).add(names[b])
    closure = {}
    for start in edges:
        seen, stack = set(), [start]
        while stack:
            for n in edges.get(stack.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    stack.append(n)
        closure[start] = seen
    return edges, closure


def compiled_headers(build_dir):
    """Target -> repository files its objects read (from ninja's dependency log)."""
    out = subprocess.run(['ninja', '-C', build_dir, '-t', 'deps'], check=True,
                         capture_output=True, text=True).stdout
    reads = {}
    target = None
    build_abs = os.path.abspath(build_dir)
    for line in out.splitlines():
        m = OBJECT_RE.match(line)
        if m:
            target = m.group(2)
            reads.setdefault(target, set())
            continue
        if not line.startswith(' ') or target is None:
            if line and not line.startswith(' '):
                target = None
            continue
        path = os.path.normpath(os.path.join(build_abs, line.strip()))
        if path.startswith(build_abs + os.sep) or not path.startswith(REPO + os.sep):
            continue  # generated (the build tree) or not ours (system headers)
        reads[target].add(os.path.relpath(path, REPO))
    return reads


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    build_dir = sys.argv[1]
    roots = [r.rstrip('/') for r in (sys.argv[2:] or ['common/engine', 'kvtransfer'])]
    folders, objects = module_targets()
    target_module = {t: f for f, ts in folders.items() for t in ts}
    edges, closure = link_graph(build_dir)
    problems = []
    for target, files in sorted(compiled_headers(build_dir).items()):
        mine = target_module.get(target)
        if mine is None or not any(mine == r or mine.startswith(r + '/') for r in roots):
            continue  # not a library of a checked module (tests, tools, other roots)
        links = closure.get(target, set()) | {target}
        if target in objects:  # compiled into the libraries linking it: what they link, too
            for consumer, linked in edges.items():
                if target in linked:
                    links |= closure.get(consumer, set()) | {consumer}
        # A target may compile another folder's sources (an emulated twin, an object library's
        # sources compiled again): their module's headers are its own too.
        own = {mine} | {owner(p, folders) for p in files if p.endswith(('.cc', '.cu'))}
        for path in sorted(files):
            theirs = owner(path, folders)
            if theirs is None or theirs in own:
                continue
            if not folders[theirs] & links:
                problems.append(f'{target} ({mine}) reads {path} of {theirs} '
                                f'({", ".join(sorted(folders[theirs]))}) without linking it')
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
