"""Summarize a run of run_suite.py: the tests in scope, passed and failed, and the pass rate.

A test is out of scope when classify.py excluded it (it reads PopART's IR, logs or reports) or when the
shim recorded that it names tensors PopART's IR adds (OUTDIR/marks.txt, and any --marks=FILE, e.g. the
marks of a later run to classify an earlier one the same way).

usage: python summarize.py OUTDIR [--files] [--fails] [--by-msg] [--marks=FILE]
"""
import collections
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

from common import EXCLUDED


def results(out: str):
    """(file, test id, status, first line of the failure) of every test in ``out``'s JUnit files."""
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "*.xml"))):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            name = case.get("classname", "") + "::" + case.get("name", "")
            status, message = "pass", ""
            for child in case:
                if child.tag in ("failure", "error"):
                    status = child.tag
                    message = (child.get("message") or "").strip().splitlines()[0][:200] if child.get("message") else ""
                elif child.tag == "skipped":
                    status, message = "skip", (child.get("message") or "")[:120]
            rows.append((os.path.basename(path)[:-4], name, status, message))
    return rows


def out_of_scope(out: str, extra_marks):
    excluded = json.load(open(EXCLUDED))
    marks = {}
    for mark_file in [os.path.join(out, "marks.txt")] + list(extra_marks):
        if os.path.exists(mark_file):
            for line in open(mark_file):
                nodeid, reason = line.rstrip("\n").split("\t")
                marks[nodeid] = reason.split(" (")[0]

    def reason(test_id: str):
        classname, name = test_id.split("::", 1)
        rel = classname.replace("integration.", "", 1).replace(".", "/") + ".py"
        static = excluded.get(f"{rel}::{name.split('[')[0]}")
        return static[0] if static else marks.get(f"integration/{rel}::{name}")
    return reason


def main():
    out = sys.argv[1]
    reason = out_of_scope(out, [a[len("--marks="):] for a in sys.argv if a.startswith("--marks=")])
    rows = [(f, n, s if s == "skip" or not reason(n) else "excluded:" + reason(n), m) for f, n, s, m in results(out)]
    counts = collections.Counter(r[2] for r in rows)
    ran = counts["pass"] + counts["failure"] + counts["error"]
    files = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(out, "*.xml"))}
    print(f"files: {len(files)}; tests: {dict(sorted(counts.items()))}")
    print(f"in scope: {counts['pass']} passed of {ran} = {counts['pass'] / max(ran, 1):.1%}")
    if "--files" in sys.argv:
        per = collections.defaultdict(collections.Counter)
        for f, _, s, _ in rows:
            per[f][s] += 1
        for f, c in sorted(per.items()):
            print(f"{f}: {dict(c)}")
    if "--fails" in sys.argv:
        for _, n, s, m in rows:
            if s in ("failure", "error"):
                print(f"{s[0]} {n}: {m}")
    if "--by-msg" in sys.argv:
        c = collections.Counter(re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", m)[:110]
                                for _, _, s, m in rows if s in ("failure", "error"))
        for k, v in c.most_common(80):
            print(f"{v:5d} {k}")


if __name__ == "__main__":
    main()
