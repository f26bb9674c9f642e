#!/bin/sh
# proxypool preinstall: deb preinst (install|upgrade|abort-upgrade),
# rpm %pre (1 = install, 2 = upgrade).
#
# Creates the proxypool account before the files are unpacked, so that
# dpkg/rpm can give /etc/proxypool/proxypool.yaml its group. The sysusers
# line is packaging/sysusers.d/proxypool.conf, which is not on disk yet.
set -e

SYSUSERS_LINE='u proxypool - "Proxy Pool" /var/lib/proxypool'

create_user() {
	if command -v systemd-sysusers >/dev/null 2>&1; then
		printf '%s\n' "$SYSUSERS_LINE" |
			systemd-sysusers --replace=/usr/lib/sysusers.d/proxypool.conf - >/dev/null 2>&1 || true
	fi
	# Fallback: no systemd-sysusers, or one too old for --replace.
	if ! getent passwd proxypool >/dev/null 2>&1; then
		getent group proxypool >/dev/null 2>&1 || groupadd --system proxypool
		nologin=$(command -v nologin 2>/dev/null || echo /usr/sbin/nologin)
		useradd --system --gid proxypool --home-dir /var/lib/proxypool \
			--no-create-home --shell "$nologin" --comment "Proxy Pool" proxypool
	fi
}

case "$1" in
install | upgrade | 1 | 2)
	create_user
	;;
esac
exit 0
