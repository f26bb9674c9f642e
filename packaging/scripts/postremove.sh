#!/bin/sh
# proxypool postremove: deb postrm (remove | purge | upgrade |
# failed-upgrade | abort-install | abort-upgrade | disappear), rpm %postun
# (0 = erase, 1 = upgrade).
#
# deb "remove" keeps the configuration, /var/lib/proxypool and the proxypool
# account; "purge" deletes all three. rpm has no purge: an erase keeps
# /var/lib/proxypool and the account (they are not in the payload, and a
# reused uid would inherit whatever files the old one left), and saves an
# edited proxypool.yaml as proxypool.yaml.rpmsave. docs/operations.md
# "Uninstall" gives the commands that finish the job by hand.
set -e

systemd_running() { [ -d /run/systemd/system ]; }

daemon_reload() {
	if systemd_running; then
		systemctl --system daemon-reload >/dev/null 2>&1 || true
	fi
}

case "$1" in
remove | 0)
	daemon_reload
	;;
purge)
	rm -rf /var/lib/proxypool /etc/proxypool
	if getent passwd proxypool >/dev/null 2>&1; then
		userdel proxypool >/dev/null 2>&1 || true
	fi
	if getent group proxypool >/dev/null 2>&1; then
		groupdel proxypool >/dev/null 2>&1 || true
	fi
	daemon_reload
	;;
1)
	# rpm upgrade: the new files are in place, restart a running service.
	daemon_reload
	if systemd_running; then
		systemctl try-restart proxypool.service >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
