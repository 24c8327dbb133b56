#!/usr/bin/env bash
# Installs a Vulkan implementation that runs on the CPU, for the WebGPU execution provider
# (Dawn over Vulkan) on a machine without a GPU: the Vulkan loader (libvulkan1) and
# bookworm-backports' Mesa (lavapipe 25.x). Debian bookworm's own Mesa 22.3 is refused by
# Dawn ("Vulkan shaderUniform*ArrayDynamicIndexing required"), so the backports suite is
# added on the same mirror as bookworm's entry in apt's sources.
#
# Runs as root (CI does); idempotent: exits 0 at once when lavapipe's ICD is already there.
# On a machine with a GPU, install the vendor's driver instead (it brings its own ICD) and
# Debian's libvulkan1.
set -euo pipefail

icd_present() {
	for f in /usr/share/vulkan/icd.d/lvp_icd*.json; do [ -e "$f" ] && return 0; done
	return 1
}
mesa_ok() {
	# Mesa 25 or newer (bookworm-backports); 22.x is refused by Dawn.
	v=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
	[ -n "$v" ] && dpkg --compare-versions "$v" ge 25
}
if icd_present && mesa_ok && ldconfig -p | grep -q 'libvulkan.so.1 '; then
	echo "install-vulkan: lavapipe $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers) and libvulkan1 already installed"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "install-vulkan: needs root (apt-get); as root run: $0" >&2
	exit 1
fi
. /etc/os-release
if [ "${VERSION_CODENAME:-}" != bookworm ]; then
	echo "install-vulkan: written for Debian bookworm (this is ${PRETTY_NAME:-unknown}); install libvulkan1 and a Mesa >= 25 lavapipe by hand" >&2
	exit 1
fi
# The mirror bookworm comes from, in either source format.
mirror=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
	grep -v security | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' | awk '{print $1; exit}' || true)
mirror=${mirror:-http://deb.debian.org/debian}
list=/etc/apt/sources.list.d/ortbus-bookworm-backports.list
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
	echo "deb $mirror bookworm-backports main" >"$list"
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends -t bookworm-backports mesa-vulkan-drivers libvulkan1 >/dev/null
icd_present || { echo "install-vulkan: mesa-vulkan-drivers installed but no lavapipe ICD in /usr/share/vulkan/icd.d" >&2; exit 1; }
echo "install-vulkan: lavapipe $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers) and libvulkan1 installed"
