#!/usr/bin/env bash
# Installs Debian's chromium, the headless browser of the page's tests (test/page_test.go,
# driven by chromedp), and a font for its text (fonts-dejavu-core). Runs as root (CI
# does); idempotent: exits 0 at once when a chromium is already on $PATH.
#
# Without it the page's tests skip (outside CI) or fail (CI=true).
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
	echo "install-chromium: $(chromium --version 2>/dev/null | head -n1) already installed"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "install-chromium: needs root (apt-get); as root run: $0" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null || { echo "install-chromium: chromium installed but not on \$PATH" >&2; exit 1; }
echo "install-chromium: $(chromium --version 2>/dev/null | head -n1) installed"
