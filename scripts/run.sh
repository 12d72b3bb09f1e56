#!/usr/bin/env bash
# Set up and run a single nsqd on the embedded default (TCP 4150, HTTP 4151, data in ./data).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p data
exec .venv/bin/nsqd --data-path=data "$@"
