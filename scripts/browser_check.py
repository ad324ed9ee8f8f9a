"""The full real-browser check: every course notebook under Run All, then the drill.

    python scripts/browser_check.py            # every notebook (CI runs two: see docs/testing.md)
    python scripts/browser_check.py -x -v      # extra arguments go to pytest

Runs tests/browser with DISTLAB_BROWSER_NOTEBOOKS=all. Needs Debian's Chromium and the
``browser`` extra (``apt-get install chromium && pip install -e ".[browser]"``); it fails,
rather than skips, when either is missing. Screenshots land in out/browser/.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    env = dict(os.environ, DISTLAB_BROWSER_NOTEBOOKS="all", CI=os.environ.get("CI") or "1")
    command = [sys.executable, "-m", "pytest", "tests/browser", "--durations=0", *argv]
    print("+", " ".join(command), flush=True)
    return subprocess.call(command, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
