#!/usr/bin/env bash
# Debian's chromium, headless, for the browser tests of the HTML report and
# of `basecamp serve` (cli/tests/report_browser.rs).
#
#   scripts/browser.sh install
#       Install chromium with apt-get unless it is already there. Idempotent.
#   scripts/browser.sh path
#       Print the browser's path (fails when none is installed).
#
# Tests find the browser through $BASECAMP_CHROMIUM, then /usr/bin/chromium;
# they skip with a message naming this script when there is none.
set -euo pipefail

die() { echo "browser.sh: $*" >&2; exit 1; }

find_browser() {
    for candidate in "${BASECAMP_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
        if [[ -n "$candidate" && -x "$candidate" ]]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

case "${1:-}" in
    install)
        if find_browser >/dev/null; then
            echo "browser.sh: $(find_browser) is installed"
            exit 0
        fi
        command -v apt-get >/dev/null || die "no apt-get here; install chromium yourself and set BASECAMP_CHROMIUM"
        SUDO=""
        if [[ "$(id -u)" != 0 ]]; then
            command -v sudo >/dev/null || die "apt-get needs root; run as root or install sudo"
            SUDO="sudo"
        fi
        export DEBIAN_FRONTEND=noninteractive
        $SUDO apt-get update -qq
        $SUDO apt-get install -y -qq --no-install-recommends chromium
        find_browser >/dev/null || die "apt-get finished but no chromium binary was found"
        echo "browser.sh: $(find_browser) installed ($("$(find_browser)" --version 2>/dev/null || echo 'version unknown'))"
        ;;
    path)
        find_browser || die "no chromium installed; run scripts/browser.sh install"
        ;;
    *)
        die "usage: scripts/browser.sh install | path"
        ;;
esac
