# Sourced by demo.sh and test.sh: make ./.venv with the dev/test setup (idempotent).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "gpuprof: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.gpuprof-installed
if [ ! -f "$stamp" ] || [ requirements-dev.txt -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "gpuprof: installing requirements-dev.txt into .venv (torch==2.13.0 CPU build)" >&2
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements-dev.txt
  touch "$stamp"
fi
