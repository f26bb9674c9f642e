#!/bin/sh
# proxypool postinstall: deb postinst (configure [old-version] |
# abort-upgrade | abort-remove | abort-deconfigure), rpm %post (1 = install,
# 2 = upgrade).
#
# Never enables or starts the service: the shipped configuration has no
# upstream, so the operator configures first, then
# `systemctl enable --now proxypool`. An upgrade restarts a running service
# (deb here; rpm in %postun, once the old files are gone).
set -e

# The account normally exists already (preinstall); this repeats it from
# the installed sysusers.d file in case preinstall's attempt could not run.
create_user() {
	if command -v systemd-sysusers >/dev/null 2>&1; then
		systemd-sysusers /usr/lib/sysusers.d/proxypool.conf >/dev/null 2>&1 || true
	fi
	if ! getent passwd proxypool >/dev/null 2>&1; then
		getent group proxypool >/dev/null 2>&1 || groupadd --system proxypool
		nologin=$(command -v nologin 2>/dev/null || echo /usr/sbin/nologin)
		useradd --system --gid proxypool --home-dir /var/lib/proxypool \
			--no-create-home --shell "$nologin" --comment "Proxy Pool" proxypool
	fi
}

create_state_dir() {
	if command -v systemd-tmpfiles >/dev/null 2>&1; then
		systemd-tmpfiles --create /usr/lib/tmpfiles.d/proxypool.conf >/dev/null 2>&1 || true
	fi
	if [ ! -d /var/lib/proxypool ]; then
		install -d -m 0750 -o proxypool -g proxypool /var/lib/proxypool
	fi
}

systemd_running() { [ -d /run/systemd/system ]; }

case "$1" in
configure | 1 | 2)
	create_user
	create_state_dir
	if systemd_running; then
		systemctl --system daemon-reload >/dev/null 2>&1 || true
		# deb: "configure OLD-VERSION" is an upgrade.
		if [ "$1" = configure ] && [ -n "$2" ]; then
			systemctl try-restart proxypool.service >/dev/null 2>&1 || true
		fi
	fi
	;;
esac
exit 0
