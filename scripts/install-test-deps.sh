#!/usr/bin/env bash
# Install the npm dependencies of the nsqjs compatibility tests (tests/compat/js).
# Idempotent and quiet: `npm ci` from the committed package-lock.json, skipped when
# node_modules already matches the lock file. Needs node >= 12 and npm >= 7.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
js_dir="$here/../tests/compat/js"
cd "$js_dir"

if ! command -v npm >/dev/null 2>&1; then
    echo "install-test-deps: npm not found (install Node.js 20)" >&2
    exit 1
fi

stamp="node_modules/.nsqx-lock.sha256"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -f node_modules/nsqjs/package.json ]]; then
    exit 0
fi

npm ci --no-audit --no-fund --loglevel=error >/dev/null
echo "$want" > "$stamp"
node -e "require('nsqjs'); require('snappystream')" \
    || { echo "install-test-deps: nsqjs did not install correctly" >&2; exit 1; }
