"""The examples in examples/ run and check themselves against NumPy float64 (each asserts)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize("name", ["mlp.py", "transformer.py"])
def test_example_runs_and_matches_numpy(name):
    out = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "max |error| vs float64" in out.stdout
