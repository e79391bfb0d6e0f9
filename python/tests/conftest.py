"""pytest configuration for blobpipe's Python tests.

Run through Bazel (``bazel/bazelw test //python:all``, and ``//...``), which
calls ``python/tests/run_pytest.sh`` with Debian's /usr/bin/python3 and the
built package on PYTHONPATH.

A skipped case prints the repository's skip line into the test log,
``SKIPPED: <target> <case>: <reason>``, the same line the other suites print,
and is counted by pytest as skipped, never as passed.
"""

from __future__ import annotations

import os
import sys


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


_config = None


def pytest_configure(config) -> None:
    global _config
    _config = config


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        target = os.environ.get("TEST_TARGET", "python-tests")
        line = f"SKIPPED: {target} {report.nodeid}: {_skip_reason(report)}"
        reporter = _config.pluginmanager.get_plugin("terminalreporter") if _config else None
        if reporter is None:  # -p no:terminal
            print(line, file=sys.__stdout__, flush=True)
        else:  # on a line of its own, after the progress dots so far
            reporter.write(f"\n{line}\n")
