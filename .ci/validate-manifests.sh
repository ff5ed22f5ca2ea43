#!/usr/bin/env bash
# Validates deploy/ without a cluster:
#   - every Kubernetes manifest (*.yaml) against the Kubernetes OpenAPI schemas, strictly (unknown
#     fields are errors), with kubernetes-validate from PyPI. The schemas ship inside the package,
#     so after the first install this runs offline;
#   - every JSON file (*.json, *.conflist) with python3 -m json.tool, plus the conflist inside the
#     eniipam-cni ConfigMap, which must equal deploy/10-eniipam.conflist;
#   - install-cni.sh with `sh -n` (and shellcheck, when installed).
# Exits non-zero on any failure, naming the file. Idempotent; re-runs reuse the venv and take seconds.
#
# Knobs: ENIIPAM_VENV (default $HOME/.cache/eniipam-venv), K8S_VERSIONS (space-separated Kubernetes
# versions to validate against; each must be one the installed kubernetes-validate ships schemas
# for, see `kubernetes-validate --help`), KUBERNETES_VALIDATE_VERSION (the PyPI version to install).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${ENIIPAM_VENV:-$HOME/.cache/eniipam-venv}"
KV_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"
# The oldest and the newest Kubernetes minor this repo's manifests are meant for.
K8S_VERSIONS="${K8S_VERSIONS:-1.29.0 1.33.0}"
DEPLOY=deploy

failures=0
fail() { printf 'FAIL %s: %s\n' "$1" "$2" >&2; failures=$((failures + 1)); }
ok() { printf 'ok   %s\n' "$*"; }

command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 1; }

# 1. kubernetes-validate in a reused venv (installed once; upgraded only when the pin changes).
if ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep -qx "$KV_VERSION"; then
  echo "installing kubernetes-validate==$KV_VERSION into $VENV"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi
KV="$VENV/bin/kubernetes-validate"
schemas="$("$VENV/bin/python" -c 'import kubernetes_validate, os; print(os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema"))')"

# 2. Kubernetes manifests.
shopt -s nullglob
manifests=("$DEPLOY"/*.yaml "$DEPLOY"/*.yml)
[ ${#manifests[@]} -gt 0 ] || fail "$DEPLOY" "no Kubernetes manifests found"
for v in $K8S_VERSIONS; do
  if [ ! -d "$schemas/v$v-local-strict" ]; then
    have=""
    for d in "$schemas"/v*-local-strict; do d="${d##*/v}"; have="$have ${d%-local-strict}"; done
    fail "K8S_VERSIONS" "kubernetes-validate $KV_VERSION has no schemas for $v (have:$have)"
    continue
  fi
  for f in "${manifests[@]}"; do
    if out="$("$KV" --strict --quiet -k "$v" "$f" 2>&1)"; then
      ok "$f (Kubernetes $v, strict)"
    else
      fail "$f" "does not validate against Kubernetes $v (strict):"
      printf '%s\n' "$out" | sed 's/^/       /' >&2
    fi
  done
done

# 3. JSON files.
for f in "$DEPLOY"/*.json "$DEPLOY"/*.conflist; do
  if out="$(python3 -m json.tool "$f" 2>&1 >/dev/null)"; then
    ok "$f (JSON)"
  else
    fail "$f" "invalid JSON: $out"
  fi
done

# 4. The conflist in the ConfigMap must parse and equal deploy/10-eniipam.conflist.
if out="$("$VENV/bin/python" - "$DEPLOY/configmap.yaml" "$DEPLOY/10-eniipam.conflist" 2>&1 <<'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cms = [d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "eniipam-cni"]
if not cms:
    sys.exit("no ConfigMap eniipam-cni")
embedded = json.loads(cms[0]["data"]["10-eniipam.conflist"])
if embedded != json.load(open(sys.argv[2])):
    sys.exit("the eniipam-cni ConfigMap's 10-eniipam.conflist differs from " + sys.argv[2])
PY
)"; then
  ok "$DEPLOY/configmap.yaml (embedded conflist = $DEPLOY/10-eniipam.conflist)"
else
  fail "$DEPLOY/configmap.yaml" "$out"
fi

# 5. Shell scripts.
for f in "$DEPLOY"/*.sh; do
  if out="$(sh -n "$f" 2>&1)"; then
    ok "$f (sh -n)"
  else
    fail "$f" "shell syntax: $out"
  fi
  if command -v shellcheck >/dev/null; then
    if out="$(shellcheck -s sh "$f" 2>&1)"; then ok "$f (shellcheck)"; else fail "$f" "shellcheck:"; printf '%s\n' "$out" >&2; fi
  fi
done

if [ "$failures" -gt 0 ]; then
  echo "validate-manifests: $failures failure(s)" >&2
  exit 1
fi
echo "validate-manifests: all deploy/ files are valid"
