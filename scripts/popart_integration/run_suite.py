"""Run PopART's Python integration tests (as registered in its CMake for the Cpu and IpuModel2
variants; popxl, a different API, excluded) against openpop. One pytest process per registered
file, in the extracted PopART tree, tests unmodified, with the plugin openpop_popart_shim.py.

usage: [PIT_SRC=/path/to/openpop/src] python run_suite.py OUTDIR [-j N] [--rerun] [FILTER...]
PIT_SRC: run another openpop checkout's src (or a `git archive` snapshot of one) than the installed one.
FILTER: only the registered files whose path contains one of these strings. A file whose JUnit XML is
already in OUTDIR is skipped (an interrupted run resumes); --rerun runs the selected files again.
Each file has PIT_FILE_TIMEOUT seconds (1800) and PIT_MEMORY_GB of address space (8); each test
PIT_TEST_TIMEOUT seconds (300, the shim). Results: OUTDIR/<file>.xml and .log, OUTDIR/marks.txt.
"""
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time

from common import HERE, POPART, REGISTERED


def entries():
    reg = json.load(open(REGISTERED))
    by_file = {}
    for t in reg:
        variant = t["variants"][0]
        if variant not in ("Cpu", "IpuModel2") or t["disabled"] or t["file"].startswith("popxl"):
            continue
        e = by_file.setdefault(t["file"], {"file": t["file"], "variant": variant, "k": []})
        m = t["matchexpr"]
        if m and "${" not in m:
            e["k"].append(m.strip('"'))
        elif m:
            e["all"] = True
    for e in by_file.values():
        if e.pop("all", False):
            e["k"] = []
    return list(by_file.values())


def run(e, outdir):
    name = e["file"].replace("/", "__")[:-3]
    xml = os.path.join(outdir, name + ".xml")
    log = os.path.join(outdir, name + ".log")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "openpop_popart_shim",
           f"--device-type={e['variant']}", f"--junitxml={xml}", "-o", "junit_family=xunit1",
           os.path.join("integration", e["file"])]
    if e["k"]:
        cmd[3:3] = ["-k", " or ".join(e["k"])]
    path = [HERE] + ([os.environ["PIT_SRC"]] if os.environ.get("PIT_SRC") else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1",
               PIT_MARK_FILE=os.path.join(outdir, "marks.txt"),
               PYTHONDONTWRITEBYTECODE="1")
    if os.path.exists(xml) and "--rerun" not in sys.argv:  # resume
        return e["file"], "done", 0.0
    t0 = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=os.path.join(POPART, "tests"), stdout=f, stderr=subprocess.STDOUT,
                                env=env, timeout=int(os.environ.get("PIT_FILE_TIMEOUT", "1800")),
                                preexec_fn=_limit_memory).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return e["file"], rc, time.time() - t0


def _limit_memory():
    """At most PIT_MEMORY_GB (8) of address space per test process: a runaway test fails, the machine
    (shared with others) keeps its memory."""
    import resource
    limit = int(float(os.environ.get("PIT_MEMORY_GB", "8")) * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main():
    outdir = sys.argv[1]
    args = [a for a in sys.argv[2:] if a != "--rerun"]
    jobs = 1
    if args[:1] == ["-j"]:
        jobs, args = int(args[1]), args[2:]
    os.makedirs(outdir, exist_ok=True)
    todo = [e for e in entries() if not args or any(a in e["file"] for a in args)]
    with cf.ThreadPoolExecutor(jobs) as ex:
        for f, rc, dt in ex.map(lambda e: run(e, outdir), todo):
            print(f"{f}: rc={rc} {dt:.0f}s", flush=True)


if __name__ == "__main__":
    main()
