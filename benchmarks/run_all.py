"""Run every benchmark in this directory, collect their JSON result lines, and write them as a
markdown table (``RESULTS.md``) and as JSON lines (``results.jsonl``).

    python benchmarks/run_all.py [--only bert_throughput host_overhead] [--timeout 900] [--out DIR]
    python benchmarks/run_all.py --targets     # only the targets table, from the last results.jsonl
    python benchmarks/run_all.py --for-targets # only the benchmarks the targets read

A benchmark is any ``*.py`` here but this file; each prints its human-readable table and then
one JSON line with a ``"benchmark"`` key (the last such line counts). They run one after
another (never concurrently: they time this machine), each in its own process with its default
arguments, plus those ``_targets.RUN_ARGUMENTS`` names (the variants a target reads that a
benchmark leaves out by default) and with the longer timeout ``_targets.RUN_SECONDS`` gives it.
A benchmark that fails or times out is listed as such; the others still run. RESULTS.md's
measurements recorded by hand (below its ``HAND_RECORDED`` line) are kept; so are the results.jsonl
records of benchmarks this run did not run.

Then every performance target (``_targets.py``) is printed as met, short or not measured, from
this run's results and, for benchmarks it did not run, the last recorded ones.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

from _targets import RUN_ARGUMENTS, RUN_SECONDS, benchmarks, check_all
from _targets import markdown as targets_markdown

from _machine import cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))


def discover():
    return sorted(name[:-3] for name in os.listdir(HERE)
                  if name.endswith(".py") and name != os.path.basename(__file__) and not name.startswith("_"))


def machine():
    cpu = cpu_name()
    try:
        import torch
        torch_version, threads = torch.__version__, torch.get_num_threads()
        cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
            if torch.cuda.is_available() else []
    except ImportError:
        torch_version, threads, cuda = "?", "?", []
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": threads, "torch": torch_version,
            "python": platform.python_version(), "gpus": cuda, "platform": platform.platform()}


def run_one(name, timeout):
    started = time.perf_counter()
    timeout = max(timeout, RUN_SECONDS.get(name, 0))
    try:
        done = subprocess.run([sys.executable, os.path.join(HERE, name + ".py"), *RUN_ARGUMENTS.get(name, ())],
                              capture_output=True, text=True,
                              timeout=timeout, cwd=os.path.dirname(HERE))
        output, status = done.stdout, ("ok" if done.returncode == 0 else f"exit {done.returncode}")
        errors = done.stderr
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        status, errors = f"timeout after {timeout} s", ""
    seconds = time.perf_counter() - started
    result = None
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                parsed = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict) and "benchmark" in parsed:
                result = parsed
    return {"name": name, "status": status, "seconds": round(seconds, 1), "result": result,
            "output": output, "stderr_tail": errors[-2000:] if status != "ok" else ""}


def flatten(value, prefix=""):
    """``{"a": {"b": 1}}`` -> ``[("a.b", 1)]``; lists of scalars stay one value."""
    if isinstance(value, dict):
        rows = []
        for key, item in value.items():
            rows.extend(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return rows
    return [(prefix, value)]


def format_value(value):
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(format_value(v) for v in value)
    return str(value)


def previous_results(path: str) -> dict:
    """benchmark name -> its last recorded JSON line in the results.jsonl at ``path``."""
    records = {}
    try:
        with open(path) as stream:
            for line in stream:
                if line.strip():
                    record = json.loads(line)
                    records[record["benchmark"]] = record
    except FileNotFoundError:
        pass
    return records


def markdown(runs, info, when, targets=""):
    lines = ["# Benchmark results", "",
             f"Run {when} by `python benchmarks/run_all.py` on: {info['cpu']}, {info['cores']} cores "
             f"({info['torch_threads']} torch threads), torch {info['torch']}, Python {info['python']}"
             + (f", GPUs: {', '.join(info['gpus'])}" if info["gpus"] else ", no GPU") + ".", "",
             "## Targets", "", targets, "",
             "## Figures", "",
             "| benchmark | metric | value |", "|---|---|---|"]
    for run in runs:
        if run["result"] is None:
            lines.append(f"| {run['name']} | status | **{run['status']}** ({run['seconds']} s) |")
            continue
        for key, value in flatten({k: v for k, v in run["result"].items() if k not in ("benchmark", "machine")}):
            lines.append(f"| {run['name']} | {key} | {format_value(value)} |")
        lines.append(f"| {run['name']} | wall time (s) | {run['seconds']} |")
    lines.append("")
    return "\n".join(lines)


# RESULTS.md's measurements recorded by hand start at this line; a run rewrites only what is above it.
HAND_RECORDED = "<!-- run_all.py rewrites the table above; it keeps everything from this line on. -->"


def kept_by_hand(path: str) -> str:
    """The hand-recorded part of the RESULTS.md at ``path`` (from ``HAND_RECORDED`` on), or ''."""
    try:
        with open(path) as stream:
            text = stream.read()
    except FileNotFoundError:
        return ""
    start = text.find(HAND_RECORDED)
    return "" if start < 0 else "\n" + text[start:]


def write_results(path: str, table: str) -> None:
    """``table`` above the hand-recorded part of the RESULTS.md at ``path`` (read before the file
    is opened for writing, which empties it)."""
    kept = kept_by_hand(path)
    with open(path, "w") as stream:
        stream.write(table + kept)


def main():
    parser = argparse.ArgumentParser(description="Run every benchmark; write RESULTS.md and results.jsonl")
    parser.add_argument("--only", nargs="+", help="benchmark names (default: all)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per benchmark")
    parser.add_argument("--out", default=HERE, help="directory for RESULTS.md and results.jsonl")
    parser.add_argument("--targets", action="store_true", help="print the targets from results.jsonl; run nothing")
    parser.add_argument("--for-targets", action="store_true", help="run only the benchmarks the targets read")
    args = parser.parse_args()
    jsonl = os.path.join(args.out, "results.jsonl")
    previous = previous_results(jsonl)
    if args.targets:
        print(targets_markdown(check_all(previous)))
        return 0
    names = args.only or (benchmarks() if args.for_targets else discover())
    unknown = sorted(set(names) - set(discover()))
    if unknown:
        parser.error(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(discover())})")
    info = machine()
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    runs = []
    for name in names:
        print(f"=== {name}", flush=True)
        run = run_one(name, args.timeout)
        print(run["output"], end="" if run["output"].endswith("\n") else "\n", flush=True)
        if run["status"] != "ok":
            print(f"!!! {name}: {run['status']}\n{run['stderr_tail']}", flush=True)
        runs.append(run)
    os.makedirs(args.out, exist_ok=True)
    records = dict(previous)
    for run in runs:
        record = run["result"] or {"benchmark": run["name"]}
        records[run["name"]] = dict(record, status=run["status"], wall_seconds=run["seconds"], run_at=when,
                                    machine=record.get("machine", info))
    with open(jsonl, "w") as stream:
        for record in records.values():
            stream.write(json.dumps(record) + "\n")
    targets = targets_markdown(check_all(records))
    print(targets)
    table = markdown(runs, info, when, targets)
    write_results(os.path.join(args.out, "RESULTS.md"), table)
    print(table)
    failed = [run["name"] for run in runs if run["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
