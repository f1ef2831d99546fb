"""Puts generated sections into docs/benchmarks.md between their <!-- BEGIN name --> and
<!-- END name --> markers; everything outside the markers (other engineers' sections, the
introduction) is kept. A section without markers in the document is appended."""
import os
import re

INTRO = """# Tandem benchmarks

One section per topic. Each generated section names the script that produced it and the exact
commands it ran; `scripts/bench/run_all.sh` regenerates every generated section in place
(between its BEGIN/END markers) and leaves the rest of this file alone, so hand-written
sections can sit beside them.
"""


def splice(doc_path, fragments):
    doc = open(doc_path).read() if os.path.exists(doc_path) else INTRO
    for path in fragments:
        fragment = open(path).read().strip() + "\n"
        m = re.match(r"<!-- BEGIN (\S+) -->", fragment)
        if not m:
            raise SystemExit(f"{path}: no BEGIN marker")
        name = m.group(1)
        pattern = re.compile(
            r"<!-- BEGIN " + re.escape(name) + r" -->.*?<!-- END " + re.escape(name) + r" -->\n?",
            re.S)
        if pattern.search(doc):
            doc = pattern.sub(lambda _: fragment, doc, count=1)
        else:
            doc = doc.rstrip("\n") + "\n\n" + fragment
    with open(doc_path + ".tmp", "w") as f:
        f.write(doc)
    os.replace(doc_path + ".tmp", doc_path)
