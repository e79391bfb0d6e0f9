"""Issue 24 item 4, by hand (not a timed test): interpreter exit with daemon
threads inside a Sender, a Consumer or a Listener, RUNS times per scenario
and way of ending (test_stream.py's EXIT_SCENARIOS x EXIT_WAYS, which the
test runs 3 times each). Counts the runs that abort, hang (60 s), end with
another status, or print "terminate called". Exit status 1 if any did.

    bazel/bazelw build //python:blobpipe
    PYTHONPATH=bazel-bin/python:python/tests /usr/bin/python3 python/tests/exit_runs.py [RUNS] [JOBS]
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


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
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
