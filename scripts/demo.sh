#!/usr/bin/env bash
# The main job: install, then train the digits MLP twice under gpuprof —
# with the CPU-heavy augmentation (the loader-stall findings fire) and without it,
# then compare the two.
set -euo pipefail
GPUPROF_REQUIREMENTS=requirements-demo.txt source "$(dirname "$0")/setup.sh"
export GPUPROF_DB=${GPUPROF_DB:-$PWD/gpuprof.db}
echo "== with CPU-heavy augmentation ==================================="
.venv/bin/python examples/digits_mlp.py
echo
echo "== --no-augment (the fix) ========================================"
.venv/bin/python examples/digits_mlp.py --no-augment --run-name digits-mlp-noaug
echo
echo "== gpuprofctl runs ==============================================="
.venv/bin/gpuprofctl runs "$GPUPROF_DB"
echo
echo "== gpuprofctl compare: what the fix was worth ===================="
.venv/bin/gpuprofctl compare "$GPUPROF_DB" digits-mlp digits-mlp-noaug
