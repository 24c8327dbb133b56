#!/usr/bin/env bash
# Makes the cgroup v2 freezer usable for `ortbus gate -pause-by freezer` and its tests
# (internal/gate, test/'s gated-tenant tests): a cgroup v2 hierarchy mounted, and a child
# cgroup with cgroup.freeze creatable under this process's own cgroup, as the gate makes
# one (internal/gate/pauser.go).
#
# On a unified system (/sys/fs/cgroup is cgroup2) or a hybrid one (cgroup2 at
# /sys/fs/cgroup/unified) nothing is installed: the check passes as it is. Where no cgroup2
# is mounted (a v1-only host), or where it is mounted read-only (a container), it mounts
# one, or remounts it read-write, as root. Idempotent; exits non-zero, saying why, when
# the freezer cannot be had (a container without the privilege to mount).
set -euo pipefail

cgroup2_mount() {
	# mountinfo: id parent major:minor root mountpoint options ... - fstype source superoptions
	awk '{for (i = 1; i <= NF; i++) if ($i == "-" && $(i+1) == "cgroup2") {print $5; exit}}' /proc/self/mountinfo
}
own_cgroup() { sed -n 's/^0:://p' /proc/self/cgroup; }

try() {
	local mnt own dir
	mnt=$(cgroup2_mount)
	[ -n "$mnt" ] || { why="no cgroup2 hierarchy is mounted"; return 1; }
	own=$(own_cgroup)
	dir="$mnt$own/ortbus-freezer-check-$$"
	if ! mkdir "$dir" 2>/dev/null; then
		why="cannot make a cgroup under $mnt$own"
		return 1
	fi
	if [ ! -e "$dir/cgroup.freeze" ]; then
		rmdir "$dir"
		why="$mnt has no cgroup.freeze (kernel older than 5.2)"
		return 1
	fi
	rmdir "$dir"
	echo "install-freezer: the cgroup v2 freezer works ($mnt$own)"
}

why=""
try && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "install-freezer: $why; needs root to mount cgroup2: as root run $0" >&2
	exit 1
fi
mnt=$(cgroup2_mount)
if [ -z "$mnt" ]; then
	# A v1-only host: cgroup2 beside the v1 hierarchies, where systemd's hybrid layout puts it.
	target=/sys/fs/cgroup/unified
	[ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] && target=/sys/fs/cgroup
	mkdir -p "$target" 2>/dev/null || true
	mount -t cgroup2 none "$target" || { echo "install-freezer: $why, and mount -t cgroup2 on $target failed" >&2; exit 1; }
else
	mount -o remount,rw "$mnt" 2>/dev/null || true
fi
if ! try; then
	echo "install-freezer: $why (after mounting): the freezer tests fail under CI" >&2
	exit 1
fi
