"""scripts/gpu_check.py, the checks only a GPU can run, on a machine without one: it says so
and exits 2 (so a lent GPU machine's run and a CPU run cannot be confused)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.mark.slow  # a fresh interpreter imports torch: seconds, minutes on a loaded machine
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run the script itself")
def test_without_a_gpu_the_script_says_so_and_exits_2():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no CUDA GPU here" in done.stdout
