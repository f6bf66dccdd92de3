#!/usr/bin/env bash
# The main job: install, then train the digits MLP twice under gpuprof —
# with the CPU-heavy augmentation (the loader-stall findings fire) and without it.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
export GPUPROF_DB=${GPUPROF_DB:-$PWD/gpuprof.db}
echo "== with CPU-heavy augmentation ==================================="
.venv/bin/python examples/digits_mlp.py
echo
echo "== --no-augment (the fix) ========================================"
.venv/bin/python examples/digits_mlp.py --no-augment --run-name digits-mlp-noaug
echo
echo "== gpuprofctl runs ==============================================="
.venv/bin/gpuprofctl runs "$GPUPROF_DB"
