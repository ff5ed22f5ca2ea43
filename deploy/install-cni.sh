#!/bin/sh
# install-cni.sh: the eniipam DaemonSet's `install-cni` container.
#
# 1. Waits until eniipamd on this node answers `eniipamctl health` (gRPC health SERVING, which the
#    daemon reports only after its startup rebuild), so a node never advertises a CNI config whose
#    daemon cannot serve yet: kubelet keeps the node NotReady until a conflist appears.
# 2. Installs the `eniipam` plugin binary into the host's CNI bin dir and writes the conflist into the
#    host's CNI conf dir, each ATOMICALLY: copy to a temp file in the destination directory, chmod,
#    then rename(2) over the target. A runtime never execs a half-written plugin or reads a
#    half-written conflist, and replacing the binary never fails with ETXTBSY while pods are being
#    wired (running copies keep the old inode).
# 3. Marks itself installed (for the container's readiness probe) and sleeps, re-checking every
#    RECHECK_INTERVAL seconds that both files are still there and current (re-installing them, the
#    same atomic way, only while the daemon is healthy).
# On SIGTERM/SIGINT it exits 0 and LEAVES EVERYTHING IN PLACE: removing the conflist would turn the
# node NotReady, and removing the plugin would make DEL of running pods fail during an upgrade.
#
# POSIX sh (dash in the image). Every setting has a default that matches deploy/daemonset.yaml.
set -eu

CNI_BIN_DIR=${CNI_BIN_DIR:-/host/opt/cni/bin}
CNI_CONF_DIR=${CNI_CONF_DIR:-/host/etc/cni/net.d}
CNI_CACHE_DIR=${CNI_CACHE_DIR:-/host/var/lib/cni/eniipam}
PLUGIN_SRC=${PLUGIN_SRC:-/opt/eniipam/bin/eniipam}
PLUGIN_NAME=${PLUGIN_NAME:-eniipam}
CONFLIST_SRC=${CONFLIST_SRC:-/etc/eniipam-cni/10-eniipam.conflist}
CONFLIST_NAME=${CONFLIST_NAME:-10-eniipam.conflist}
ENIIPAMCTL=${ENIIPAMCTL:-/opt/eniipam/bin/eniipamctl}
HEALTH_INTERVAL=${HEALTH_INTERVAL:-2}
RECHECK_INTERVAL=${RECHECK_INTERVAL:-60}
INSTALLED_MARKER=${INSTALLED_MARKER:-}
# ONESHOT=true: install once and exit (for testing the script outside Kubernetes).
ONESHOT=${ONESHOT:-false}

log() { printf '%s install-cni: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

sleeper=
tmpfile=
on_signal() {
  if [ -n "$sleeper" ]; then kill "$sleeper" 2>/dev/null || true; fi
  if [ -n "$tmpfile" ]; then rm -f "$tmpfile"; fi
  log "stopping on $1: leaving ${CNI_BIN_DIR}/${PLUGIN_NAME} and ${CNI_CONF_DIR}/${CONFLIST_NAME} in place"
  exit 0
}
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT

# Sleep that a trapped signal interrupts at once (a foreground `sleep` would delay the trap).
nap() {
  sleep "$1" &
  sleeper=$!
  wait "$sleeper" || true
  sleeper=
}

# atomic_install SRC DEST MODE: installs SRC as DEST unless DEST already has the same bytes.
# Returns 0 when DEST is current (changed or not).
atomic_install() {
  src=$1 dest=$2 mode=$3
  if [ -f "$dest" ] && cmp -s "$src" "$dest"; then
    return 0
  fi
  dir=$(dirname "$dest")
  tmpfile=$(mktemp "${dir}/.$(basename "$dest").tmp.XXXXXX") || die "cannot create a temp file in ${dir}"
  if ! cp "$src" "$tmpfile" || ! chmod "$mode" "$tmpfile"; then
    rm -f "$tmpfile"; tmpfile=
    die "cannot copy ${src} to a temp file in ${dir}"
  fi
  # rename(2) within one directory: readers see the old file or the new one, never a partial one.
  if ! mv -f "$tmpfile" "$dest"; then
    rm -f "$tmpfile"; tmpfile=
    die "cannot rename the temp file to ${dest}"
  fi
  tmpfile=
  log "installed ${dest} (from ${src}, mode ${mode})"
}

healthy() {
  "$ENIIPAMCTL" health >/dev/null 2>&1
}

install_all() {
  atomic_install "$PLUGIN_SRC" "${CNI_BIN_DIR}/${PLUGIN_NAME}" 0755
  atomic_install "$CONFLIST_SRC" "${CNI_CONF_DIR}/${CONFLIST_NAME}" 0644
}

# Preconditions: fail fast with a message naming what is missing.
[ -x "$ENIIPAMCTL" ] || die "eniipamctl not found or not executable at ${ENIIPAMCTL}"
[ -f "$PLUGIN_SRC" ] || die "plugin binary not found at ${PLUGIN_SRC}"
[ -s "$CONFLIST_SRC" ] || die "conflist not found or empty at ${CONFLIST_SRC} (is the eniipam-cni ConfigMap mounted?)"
[ -d "$CNI_BIN_DIR" ] || die "CNI bin dir ${CNI_BIN_DIR} does not exist (hostPath /opt/cni/bin mounted?)"
[ -d "$CNI_CONF_DIR" ] || die "CNI conf dir ${CNI_CONF_DIR} does not exist (hostPath /etc/cni/net.d mounted?)"
for other in "$CNI_CONF_DIR"/*.conf "$CNI_CONF_DIR"/*.conflist "$CNI_CONF_DIR"/*.json; do
  [ -e "$other" ] || continue
  case $(basename "$other") in
    "$CONFLIST_NAME") ;;
    *) log "WARNING: ${other} exists too; the runtime uses the lexically first config file, which may not be eniipam's" ;;
  esac
done
if [ ! -d "$CNI_CACHE_DIR" ]; then
  if ! mkdir -p "$CNI_CACHE_DIR" || ! chmod 0700 "$CNI_CACHE_DIR"; then
    die "cannot create ${CNI_CACHE_DIR}"
  fi
fi

log "waiting for eniipamd to be healthy (${ENIIPAMCTL} health, every ${HEALTH_INTERVAL}s)"
waited=0
until healthy; do
  waited=$((waited + HEALTH_INTERVAL))
  if [ $((waited % 30)) -lt "$HEALTH_INTERVAL" ]; then
    reason=$("$ENIIPAMCTL" health 2>&1 || true)
    log "still waiting after ${waited}s: ${reason}"
  fi
  nap "$HEALTH_INTERVAL"
done
log "eniipamd is healthy after ~${waited}s; installing"
install_all
if [ -n "$INSTALLED_MARKER" ]; then
  : > "$INSTALLED_MARKER" || die "cannot write the marker ${INSTALLED_MARKER}"
fi
log "done: ${CNI_BIN_DIR}/${PLUGIN_NAME} and ${CNI_CONF_DIR}/${CONFLIST_NAME} are current"
[ "$ONESHOT" = true ] && exit 0

while :; do
  nap "$RECHECK_INTERVAL"
  if healthy; then
    install_all
  else
    log "eniipamd is not healthy; leaving the installed files as they are"
  fi
done
