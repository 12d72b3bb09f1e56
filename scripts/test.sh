#!/usr/bin/env bash
# Set up everything the tests need (venv, pip packages, Chromium, npm packages for nsqjs)
# and run the whole suite. Extra arguments go to pytest (e.g. -m "not slow" for the quick
# subset, which needs no Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
# the browser tests (tests/admin/test_browser*.py) are all marked slow: a selection without
# them (-m "not slow") needs no Chromium
quick=0
prev=""
for arg in "$@"; do
  case "$prev:$arg" in
    -m:*"not slow"*|*:-m*"not slow"*) quick=1 ;;
  esac
  prev=$arg
done
if [ "$quick" = 1 ]; then
  echo "test: -m \"not slow\": the browser tests are not selected, Chromium is not needed"
else
  bash scripts/install-browser.sh
fi
bash scripts/install-fault-deps.sh  # nftables for tests/faults (skipped without it)
if [ -f scripts/install-test-deps.sh ]; then
  bash scripts/install-test-deps.sh
fi
.venv/bin/ruff check src tests bench
.venv/bin/lint-imports  # the layers of docs/architecture.md (contracts in pyproject.toml)
# the 30 slowest tests are listed at the end: where the suite's time goes (CI budget: 45 min)
exec .venv/bin/python -m pytest --durations=30 "$@"
