#!/usr/bin/env bash
# Create .venv and install nsqx into it (editable; `setup.sh test` adds the test extra).
# One line per step, then pip's own output. Idempotent and quick when nothing changed: the
# install is skipped while pyproject.toml, setup.py, the C source and the extra are what
# the last successful install saw (a hash in .venv/.nsqx-installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRA=${1:-}
STAMP=.venv/.nsqx-installed
say() { echo "setup: $*"; }

if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
  say "upgrading pip in .venv"
  .venv/bin/python -m pip install --upgrade pip
fi

files_hash=$(cat pyproject.toml setup.py src/nsqx/_speedups.c | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ -x .venv/bin/nsqd ]; then
  read -r done_hash done_extra < "$STAMP" || true
  # a test install also serves a plain one
  if [ "$done_hash" = "$files_hash" ] && { [ -z "$EXTRA" ] || [ "${done_extra:-}" = "$EXTRA" ]; }; then
    say "nsqx${EXTRA:+[$EXTRA]} already installed in .venv, nothing changed: skipped"
    exit 0
  fi
fi

if ! command -v "${CC:-cc}" >/dev/null 2>&1; then
  say "no C compiler (${CC:-cc}) found: installing the pure-Python build (no C speedups; slower MPUB ingest)"
fi
say "installing nsqx${EXTRA:+[$EXTRA]} (editable) into .venv"
rm -f "$STAMP"
if [ -n "$EXTRA" ]; then
  .venv/bin/python -m pip install -e ".[$EXTRA]"
else
  .venv/bin/python -m pip install -e .
fi
if .venv/bin/python -c "import nsqx._speedups" 2>/dev/null; then
  say "C speedups compiled"
elif command -v "${CC:-cc}" >/dev/null 2>&1; then
  say "C speedups did not build (Python headers missing?): the pure-Python build is used"
fi
echo "$files_hash $EXTRA" > "$STAMP"
say "done"
