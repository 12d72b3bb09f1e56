#!/usr/bin/env bash
# Make sure headless Chromium is there for the nsqadmin browser tests (tests/admin).
# Idempotent and quiet: nothing happens when /usr/bin/chromium exists; otherwise Debian's
# `chromium` package is installed with apt-get (as root, or through sudo when available).
# Playwright drives that binary (executable_path=/usr/bin/chromium); we never download a
# browser build of our own (`playwright install` is not used).
set -euo pipefail

CHROMIUM="${NSQX_CHROMIUM:-/usr/bin/chromium}"

if [[ -x "$CHROMIUM" ]]; then
    exit 0
fi

fail() {
    echo "install-browser: $*" >&2
    echo "install-browser: install Debian's chromium package by hand (apt-get install chromium)," >&2
    echo "install-browser: or run the quick subset without them: ./scripts/test.sh -m 'not slow'" >&2
    exit 1
}

if ! command -v apt-get >/dev/null 2>&1; then
    fail "$CHROMIUM is missing and apt-get is not available on this machine"
fi

SUDO=()
if [[ "$(id -u)" != "0" ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        fail "$CHROMIUM is missing and installing it needs root (no password-less sudo)"
    fi
fi

log="$(mktemp -t install-browser.XXXXXX.log)"
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
# wait (bounded) for another apt/dpkg run to finish instead of failing on its lock
if ! "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq >"$log" 2>&1; then
    cat "$log" >&2
    fail "apt-get update failed"
fi
if ! "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium fonts-dejavu-core \
        >"$log" 2>&1; then
    cat "$log" >&2
    fail "apt-get install chromium failed"
fi
if [[ ! -x "$CHROMIUM" ]]; then
    fail "chromium was installed but $CHROMIUM is still missing"
fi
