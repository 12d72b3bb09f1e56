#!/usr/bin/env bash
# Set up (skipped when nothing changed) and run one nsqd in the foreground: TCP 4150, HTTP
# 4151, data in ./data. Ctrl-C stops it; run it in its own terminal or in the background
# (./scripts/run.sh &). Extra arguments go to nsqd (e.g. --config FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p data
echo "run: starting nsqd (data in ./data); it answers once it logs 'ready'; Ctrl-C stops it"
exec .venv/bin/nsqd --data-path=data "$@"
