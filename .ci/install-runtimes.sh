#!/usr/bin/env bash
# Installs what the container-runtime tests need (tests/cri_containerd.rs, tests/podman_cni.rs), from
# Debian's packages, only what is missing, then prints the versions. Idempotent; fast when everything is
# there (no apt call at all). No service is started: the tests run containerd and podman themselves,
# inside namespaces they make.
set -euo pipefail

packages=(
  containerd runc containernetworking-plugins podman conmon # the runtimes and the reference CNI plugins
  iptables iproute2 util-linux iputils-ping                 # portmap's iptables, ip, nsenter/unshare, ping
  gcc libc6-dev                                             # the static sandbox ("pause") binary
)
installed() { dpkg-query --showformat='${Status}' --show "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for pkg in "${packages[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-runtimes: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-runtimes: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Keep maintainer scripts from starting services (containerd, podman's units) on the machine.
  policy=/usr/sbin/policy-rc.d
  added_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    added_policy=1
  fi
  trap 'if [ "$added_policy" = 1 ]; then rm -f "$policy"; fi' EXIT
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

for pkg in "${packages[@]}"; do
  installed "$pkg" || { echo "install-runtimes: $pkg is still missing" >&2; exit 1; }
done

ver() { dpkg-query --showformat='${Version}' --show "$1" 2>/dev/null || echo "?"; }
echo "containerd $(ver containerd) | runc $(ver runc) | podman $(ver podman) | conmon $(ver conmon) | containernetworking-plugins $(ver containernetworking-plugins) | iptables $(ver iptables)"
