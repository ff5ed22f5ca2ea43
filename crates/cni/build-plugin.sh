#!/usr/bin/env bash
# Builds the eniipam CNI plugin exactly as it ships. deploy/Dockerfile and eniipam-bench both run this
# script, so the benchmark measures the binary the image carries.
#
#   crates/cni/build-plugin.sh TRIPLE [cargo build options, e.g. --target-dir DIR -j 2]
#
# TRIPLE: x86_64-unknown-linux-gnu, aarch64-unknown-linux-gnu, or `host` for this machine's.
# Prints the path of the binary (<target dir>/TRIPLE/plugin/eniipam) on stdout; cargo's progress goes
# to stderr.
#
# How, and why (docs/performance.md, "Plugin start-up", has the figures):
#   - -C target-feature=+crt-static: linked statically against glibc. The plugin runs on the host,
#     whose glibc is not the builder's; and a static binary needs no dynamic loader at start-up.
#   - -C relocation-model=static: not position-independent, so there are no relocations to apply
#     at start-up (a static-pie binary relocates itself on every exec).
#   - --target TRIPLE: keeps these RUSTFLAGS off build scripts and proc macros, which run on the
#     build machine and cannot be static.
#   - --profile plugin (the workspace Cargo.toml): the release profile with fat LTO, one codegen unit
#     and panic=abort, for a smaller binary that touches fewer pages when it starts.
#   - -p eniipam-cni alone: the plugin's dependencies get only the features the plugin asks for, not
#     the union a workspace build would give them (tokio "full", the daemon's tracing features).
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 TRIPLE|host [cargo build options...]" >&2
    exit 2
fi
triple="$1"
shift
if [[ "$triple" == host ]]; then
    triple="$(rustc -vV | sed -n 's/^host: //p')"
fi
cd "$(dirname "$0")/../.."

# Exactly these flags: a RUSTFLAGS (or the encoded form cargo passes to nested builds) from the caller's
# environment would change what is measured and shipped.
unset CARGO_ENCODED_RUSTFLAGS
export RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static"

exe="$(cargo build --locked --profile plugin -p eniipam-cni --bin eniipam --target "$triple" \
    --message-format=json-render-diagnostics "$@" |
    sed -n 's/.*"executable":"\([^"]*\/eniipam\)".*/\1/p' | tail -n 1)"
if [[ -z "$exe" || ! -x "$exe" ]]; then
    echo "$0: cargo built no eniipam binary" >&2
    exit 1
fi
if readelf -lW "$exe" | grep -q 'program interpreter'; then
    echo "$0: $exe is dynamically linked; it must be static" >&2
    exit 1
fi
echo "$exe"
