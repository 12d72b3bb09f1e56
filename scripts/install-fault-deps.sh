#!/usr/bin/env bash
# Make sure the fault suite's system tools are there (tests/faults: nodes in network
# namespaces, partitions with nftables). Idempotent and quiet: nothing happens when `nft`
# and `ip` exist; otherwise Debian's nftables and iproute2 are installed with apt-get (as
# root, or through sudo when available). Not being able to install is not an error: the
# fault suite then skips with the reason.
set -euo pipefail

if command -v nft >/dev/null 2>&1 && command -v ip >/dev/null 2>&1; then
    exit 0
fi
note() { echo "install-fault-deps: $*" >&2; }
if ! command -v apt-get >/dev/null 2>&1; then
    note "nft/ip missing and no apt-get: tests/faults will skip"
    exit 0
fi
SUDO=()
if [[ "$(id -u)" != "0" ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        note "nft/ip missing and installing needs root: tests/faults will skip"
        exit 0
    fi
fi
log="$(mktemp -t install-fault-deps.XXXXXX.log)"
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! { "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq \
       && "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
          --no-install-recommends nftables iproute2; } >"$log" 2>&1; then
    cat "$log" >&2
    note "apt-get install nftables iproute2 failed: tests/faults will skip"
fi
