"""pytest configuration for blobpipe's Python tests.

Run through Bazel (``bazel/bazelw test //python:all``, and ``//...``), which
calls ``python/tests/run_pytest.sh`` with Debian's /usr/bin/python3 and the
built package on PYTHONPATH.

A skipped case prints the repository's skip line into the test log,
``SKIPPED: <target> <case>: <reason>``, the same line the other suites print,
and is counted by pytest as skipped, never as passed. When every case
collected skipped, the run ends with the line by which .ci/run counts the
target as skipped rather than passed (test/skip.hpp prints the same):
``ALL SKIPPED: <target>: <n> of <n> cases``.
"""

from __future__ import annotations

import os
import sys


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


_config = None
_skipped: set = set()  # the node ids of the cases that skipped


def _target() -> str:
    return os.environ.get("TEST_TARGET", "python-tests")


def _print(line: str) -> None:
    reporter = _config.pluginmanager.get_plugin("terminalreporter") if _config else None
    if reporter is None:  # -p no:terminal
        print(line, file=sys.__stdout__, flush=True)
    else:  # on a line of its own, after the progress dots so far
        reporter.write(f"\n{line}\n")


def pytest_configure(config) -> None:
    global _config
    _config = config


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        if report.when != "teardown":  # skipped in teardown, the case ran
            _skipped.add(report.nodeid)
        _print(f"SKIPPED: {_target()} {report.nodeid}: {_skip_reason(report)}")


def pytest_sessionfinish(session, exitstatus) -> None:
    collected = session.testscollected
    if collected and len(_skipped) >= collected:
        _print(f"ALL SKIPPED: {_target()}: {len(_skipped)} of {collected} cases")
