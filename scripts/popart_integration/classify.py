"""Classify PopART integration tests as in or out of scope (issue 31: tests that read PopART's IR,
logs, reports or internal tensor names are out). A test is out when its function, or a module-level
function or class it uses (transitively, same file or the file's local helper modules), contains one
of MARKERS. usage: classify.py [--list]  -> writes $PIT_DIR/excluded.json {file::test function: reasons}"""
import ast
import json
import os
import re
import sys

from common import EXCLUDED, REGISTERED
from common import INTEGRATION as ROOT

MARKERS = {
    "IR": ["_serializeIr", "getIr(", ".getIr", "IrSerializationFormat", "popart._internal", "_getGraph",
           "getMainGraph", "ir.json", "\"maingraph\"", "'maingraph'", "_getOpsOfType", "getAllOps",
           "serializeIr", "dotChecks", "exportDot"],
    "report": ["getSummaryReport", "getReport(", "getExecutionReport", "getGraphReport", "getSerializedGraph",
               "pva.", "import pva", "gcprofile", "autoReport", "profile.pop", "initializePoplarDebugInfo",
               "PoplarDebugInfo", "getCycleCount", "instrumentWithHardwareCycleCounter"],
    "log": ["capfd", "caplog", "capsys", "POPART_LOG_LEVEL"],
}
# Internal tensor names: literal ones in the test function itself (helpers may hold them for other tests);
# calls of popart.reserved*Prefix() are recorded at run time by the shim (marks.txt).
OWN_BODY_MARKERS = {"internal tensor name": ["finalLossScale", "autoLossScaleStats", "getAllTensorIds",
                                             "lossScaling_", "Accl___", "Accum___", "Step___"]}


def load(path):
    src = open(path).read()
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return src, {}
    defs = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            defs[node.name] = ast.get_source_segment(src, node) or ""
    return src, defs


def reasons_of(text):
    found = set()
    for reason, marks in MARKERS.items():
        if any(m in text for m in marks):
            found.add(reason)
    return found


def names_in(text):
    return set(re.findall(r"\b([A-Za-z_]\w*)\b", text))


def classify_file(path, helper_defs):
    _src, defs = load(path)
    alldefs = dict(helper_defs)
    alldefs.update(defs)
    out = {}
    for name, _text in defs.items():
        if not name.startswith("test"):
            continue
        seen, todo, reasons = {name}, [name], set()
        while todo:
            n = todo.pop()
            t = alldefs.get(n, "")
            reasons |= reasons_of(t)
            for m in names_in(t):
                if m in alldefs and m not in seen:
                    seen.add(m)
                    todo.append(m)
        for reason, marks in OWN_BODY_MARKERS.items():
            if any(m in defs[name] for m in marks):
                reasons.add(reason)
        if reasons:
            out[name] = sorted(reasons)
    return out


def main():
    reg = sorted({t["file"] for t in json.load(open(REGISTERED))
                  if t["variants"][0] in ("Cpu", "IpuModel2") and not t["disabled"]
                  and not t["file"].startswith("popxl")})
    result = {}
    for rel in reg:
        path = os.path.join(ROOT, rel)
        d = os.path.dirname(path)
        helpers = {}
        # local helper modules imported by the test (same dir or integration/), e.g. test_session.py
        src = open(path).read()
        for mod in re.findall(r"^\s*(?:from|import)\s+(\w+)", src, re.M):
            for cand in (os.path.join(d, mod + ".py"), os.path.join(ROOT, mod + ".py")):
                if os.path.exists(cand) and mod not in ("test_util",):
                    helpers.update(load(cand)[1])
        for fn, reasons in classify_file(path, helpers).items():
            result[f"{rel}::{fn}"] = reasons
    json.dump(result, open(EXCLUDED, "w"), indent=1, sort_keys=True)
    from collections import Counter
    c = Counter(r for v in result.values() for r in v)
    print(len(result), "test functions excluded;", dict(c))
    if "--list" in sys.argv:
        for k, v in sorted(result.items()):
            print(k, v)


if __name__ == "__main__":
    main()
