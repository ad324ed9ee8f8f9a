#!/usr/bin/env bash
# The GPU checks (NCCL collectives, the composed loop on the GPUs, CUDA memory against
# distlab.calc) in one bounded run: see scripts/gpu_check.py. Exit 0 all pass, 1 a check
# failed, 2 no GPU, 124 it ran past its 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 300 python scripts/gpu_check.py "$@"
