#!/usr/bin/env bash
# Set up everything the tests need (venv, pip packages, npm packages for nsqjs) and run
# the whole suite. Extra arguments go to pytest (e.g. -m "not slow" for the quick subset).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/install-browser.sh
if [ -f scripts/install-test-deps.sh ]; then
  bash scripts/install-test-deps.sh
fi
.venv/bin/ruff check src tests bench
.venv/bin/lint-imports  # the layers of docs/architecture.md (contracts in pyproject.toml)
exec .venv/bin/python -m pytest "$@"
