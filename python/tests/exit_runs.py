"""By hand (not a timed test): interpreter exit with daemon threads inside a
Sender, a Consumer or a Listener, RUNS times per scenario and way of ending
(test_stream.py's EXIT_SCENARIOS x EXIT_WAYS, which the test runs 3 times
each). Counts the runs that abort, hang (60 s), end with another status,
or print "terminate called". Exit status 1 if any did.

With --values: test_exit.py's matrix instead, daemon threads streaming
torch, numpy or pickled values through emit, emit_many and send_blob (and
a consumer decoding them) for each way of ending (EXIT_VALUES x
EXIT_WAYS, 2 runs each in the test), and the torch-only control, whose
aborts are torch's own (counted apart, not as failures).

    bazel/bazelw build //python:blobpipe
    PYTHONPATH=bazel-bin/python:python/tests /usr/bin/python3 python/tests/exit_runs.py [--values] [RUNS] [JOBS]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from test_stream import EXIT_SCENARIOS, EXIT_WAYS


def code_of(scenario: str, way: str) -> str:
    return ("import threading, time, os, sys, signal\nimport numpy as np\nimport blobpipe as bf\n" +
            EXIT_SCENARIOS[scenario] +
            "t0 = time.monotonic()\n"
            "while time.monotonic() - t0 < 0.3: sum(range(1000))\n" + EXIT_WAYS[way])


def one(scenario: str, way: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        # SIGINT as by default in the child: a shell's background job
        # ignores it, and Python then never installs KeyboardInterrupt.
        done = subprocess.run([sys.executable, "-c", code_of(scenario, way)], env=env,
                              capture_output=True, text=True, timeout=60,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    except subprocess.TimeoutExpired:
        return "hang"
    want = -signal.SIGINT if way == "ctrl_c" else 0
    if "terminate called" in done.stderr or done.returncode == -signal.SIGABRT:
        return "abort"
    if done.returncode != want or "exiting" not in done.stdout:
        return f"status {done.returncode}"
    return "ok"


def values_main(runs: int, jobs: int) -> int:
    import test_exit as t
    bad = 0
    print(f"{'values':<10} {'way':<10} {'runs':>5} {'ok':>5}  failures")
    for values in sorted(t.EXIT_VALUES) + ["control"]:
        body = t.CONTROL if values == "control" else t.EXIT_VALUES[values] + t.EXIT_CALLS
        for way in sorted(t.EXIT_WAYS):
            code = t.exit_script(body, way)
            with ThreadPoolExecutor(jobs) as pool:
                results = list(pool.map(lambda _: t.outcome(t.run_script(code), way), range(runs)))
            failed = [r for r in results if r != "ok"]
            if values != "control":
                bad += len(failed)
            print(f"{values:<10} {way:<10} {runs:>5} {runs - len(failed):>5}  "
                  f"{', '.join(f'{r} x{failed.count(r)}' for r in sorted(set(failed))) or '-'}"
                  f"{'  (torch alone: not counted)' if values == 'control' else ''}", flush=True)
    print(f"total: {bad} runs with blobpipe failed")
    return 1 if bad else 0


def main() -> int:
    args = sys.argv[1:]
    with_values = "--values" in args
    args = [a for a in args if a != "--values"]
    runs = int(args[0]) if len(args) > 0 else 50
    jobs = int(args[1]) if len(args) > 1 else 2
    if with_values:
        return values_main(runs, jobs)
    bad = 0
    print(f"{'scenario':<26} {'way':<9} {'runs':>5} {'ok':>5}  failures")
    for scenario in sorted(EXIT_SCENARIOS):
        for way in sorted(EXIT_WAYS):
            with ThreadPoolExecutor(jobs) as pool:
                results = list(pool.map(lambda _: one(scenario, way), range(runs)))
            failed = [r for r in results if r != "ok"]
            bad += len(failed)
            print(f"{scenario:<26} {way:<9} {runs:>5} {runs - len(failed):>5}  "
                  f"{', '.join(sorted(set(failed))) or '-'}", flush=True)
    print(f"total: {bad} runs failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
