#!/usr/bin/env bash
# The tests: install, start what they need, lint, run them.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
if command -v pg_isready >/dev/null && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  echo "gpuprof: starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi
# the dashboard's browser tests need Chromium (they skip, saying so, without it)
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "gpuprof: installing chromium for the dashboard's browser tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || true
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the public API (pyproject.toml [tool.mypy])
.venv/bin/python -m pytest "$@"
