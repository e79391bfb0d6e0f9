"""The package without torch: each check of no_torch_checks.py runs in a
process of its own with torch blocked, so that blocking it cannot leak into
tests that need torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS_FILE = Path(__file__).with_name("no_torch_checks.py")
# Named from the source: importing the module would block torch here too.
CHECKS = [f.name for f in ast.parse(CHECKS_FILE.read_text()).body
          if isinstance(f, ast.FunctionDef) and f.name.startswith("check_")]


@pytest.mark.parametrize("name", CHECKS)
def test_without_torch(name):
    r = subprocess.run([sys.executable, str(CHECKS_FILE), name], capture_output=True, text=True,
                       env=os.environ, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
