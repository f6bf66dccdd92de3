# Sourced by demo.sh and test.sh: make ./.venv with a requirements file
# (GPUPROF_REQUIREMENTS, default the dev/test setup), idempotent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
reqs=${GPUPROF_REQUIREMENTS:-requirements-dev.txt}
if [ ! -x .venv/bin/python ]; then
  echo "gpuprof: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=".venv/.gpuprof-installed-${reqs%.txt}"
if [ ! -f "$stamp" ] || [ "$reqs" -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "gpuprof: installing $reqs into .venv (torch==2.13.0 CPU build)" >&2
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r "$reqs"
  touch "$stamp"
fi
