#!/bin/sh
# proxypool preremove: deb prerm (remove | upgrade | deconfigure |
# failed-upgrade), rpm %preun (0 = erase, 1 = upgrade).
#
# On removal (not on upgrade): stop the service and its sockets, then
# disable them while the unit files still exist to say what to disable.
set -e

UNITS="proxypool.service proxypool-gateway.socket proxypool-distribution.socket proxypool-admin.socket"

case "$1" in
remove | 0)
	if [ -d /run/systemd/system ]; then
		# shellcheck disable=SC2086 # word splitting intended
		systemctl stop $UNITS >/dev/null 2>&1 || true
	fi
	if command -v systemctl >/dev/null 2>&1; then
		# Works offline (no systemd running, chroots): it only removes links.
		# shellcheck disable=SC2086
		systemctl --no-reload disable $UNITS >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
