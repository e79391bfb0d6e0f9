"""The skip lines of conftest.py (docs/reliability.md "Skips"): a skipped
case prints its SKIPPED line, and a run whose collected cases all skipped
ends with the ALL SKIPPED line by which .ci/run counts the target as
skipped rather than passed; a run in which any case ran does not."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")
TARGET = "//python:skip_lines_fixture"

CASES = '''
import os
import pytest

def test_always_skips():
    pytest.skip("this case always skips")

def test_skips_when_told():
    if os.environ.get("BLOBPIPE_SKIP_BOTH"):
        pytest.skip("told to skip")
'''


def _run(tmp_path, *args, skip_both=False):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(CASES)
    env = dict(os.environ, TEST_TARGET=TARGET, PYTHONDONTWRITEBYTECODE="1")
    env.pop("BLOBPIPE_SKIP_BOTH", None)
    if skip_both:
        env["BLOBPIPE_SKIP_BOTH"] = "1"
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args,
                        str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_a_run_in_which_a_case_ran_is_not_all_skipped(tmp_path):
    out = _run(tmp_path)
    assert f"SKIPPED: {TARGET} test_cases.py::test_always_skips: this case always skips\n" in out
    assert "ALL SKIPPED" not in out, out


def test_a_run_whose_cases_all_skipped_says_so_at_its_end(tmp_path):
    out = _run(tmp_path, skip_both=True)
    assert f"SKIPPED: {TARGET} test_cases.py::test_skips_when_told: told to skip\n" in out
    assert f"ALL SKIPPED: {TARGET}: 2 of 2 cases\n" in out, out


def test_all_skipped_counts_the_cases_the_run_selected(tmp_path):
    out = _run(tmp_path, "-k", "always")
    assert f"ALL SKIPPED: {TARGET}: 1 of 1 cases\n" in out, out
