#!/usr/bin/env bash
# Installs the peers `make bench-peers` compares the gateway with, from
# Debian packages, then stops the services the packages may have started:
# the suite runs its own instances, with its own configs, on loopback
# ports, and stops them by PID.
set -euo pipefail
need=()
command -v squid >/dev/null 2>&1 || need+=(squid)
command -v tinyproxy >/dev/null 2>&1 || need+=(tinyproxy)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${need[@]}" || { apt-get update -qq && apt-get install -y -qq "${need[@]}"; }
fi
for svc in squid tinyproxy; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc"
  elif [ -x "/etc/init.d/$svc" ] && /etc/init.d/"$svc" status >/dev/null 2>&1; then
    /etc/init.d/"$svc" stop
  fi
done
echo "squid: $(squid -v | head -1)"
echo "tinyproxy: $(tinyproxy -v 2>&1 | head -1)"
