#!/usr/bin/env bash
# Validates deploy/ without a cluster:
#   - every Kubernetes manifest (*.yaml) against the Kubernetes OpenAPI schemas, strictly (unknown
#     fields are errors), with kubernetes-validate from PyPI. The schemas ship inside the package,
#     so after the first install this runs offline;
#   - every JSON file (*.json, *.conflist) with python3 -m json.tool, plus the conflist inside the
#     eniipam-cni ConfigMap, which must equal deploy/10-eniipam.conflist;
#   - the migration's node selection: eniipam's DaemonSet and aws-node patched with
#     deploy/aws-node-exclude-eniipam.patch.json select complementary nodes (never both, never
#     neither on an EC2 Linux node), and neither runs on Fargate, Auto Mode or hybrid nodes;
#   - the socket variable: every manifest uses ENIIPAM_SOCKET_PATH (the name eniipamd and
#     eniipamctl read), never another spelling;
#   - shell scripts, if any, with `sh -n` (and shellcheck, when installed).
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

# 5. Node selection: eniipam vs aws-node patched with the shipped JSON patch.
if out="$("$VENV/bin/python" - "$DEPLOY/daemonset.yaml" "$DEPLOY/aws-node-exclude-eniipam.patch.json" 2>&1 <<'PY'
import copy, json, sys, yaml
ds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "DaemonSet"][0]
patch = json.load(open(sys.argv[2]))
# aws-node's affinity as the VPC CNI ships it (config/master/aws-k8s-cni.yaml, v1.2x).
aws_node = {"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
        {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate", "hybrid", "auto"]},
    ]}]}}}}}}}
def apply(doc, ops):
    doc = copy.deepcopy(doc)
    for op in ops:
        if op["op"] != "add":
            sys.exit(f"unexpected patch op {op['op']}")
        *parents, last = op["path"].lstrip("/").split("/")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if last == "-":
            node.append(op["value"])
        elif isinstance(node, list):
            node.insert(int(last), op["value"])
        else:
            node[last] = op["value"]
    return doc
def selects(pod_spec, labels):
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    def expr_ok(e):
        v = labels.get(e["key"])
        if e["operator"] == "In": return v in e["values"]
        if e["operator"] == "NotIn": return v not in e["values"]
        if e["operator"] == "Exists": return v is not None
        if e["operator"] == "DoesNotExist": return v is None
        sys.exit(f"operator {e['operator']}")
    ok_terms = any(all(expr_ok(e) for e in t.get("matchExpressions", [])) for t in terms)
    return ok_terms and all(labels.get(k) == v for k, v in pod_spec.get("nodeSelector", {}).items())
eniipam = ds["spec"]["template"]["spec"]
patched = apply(aws_node, patch)["spec"]["template"]["spec"]
base = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
cases = [
    ({}, "aws-node"),
    ({"kubernetes.io/arch": "arm64"}, "aws-node"),
    ({"eniipam.io/enabled": "true"}, "eniipam"),
    ({"eniipam.io/enabled": "true", "kubernetes.io/arch": "arm64"}, "eniipam"),
    ({"eniipam.io/enabled": "false"}, "aws-node"),
    ({"eniipam.io/enabled": "true", "eks.amazonaws.com/compute-type": "fargate"}, None),
    ({"eniipam.io/enabled": "true", "eks.amazonaws.com/compute-type": "auto"}, None),
    ({"eniipam.io/enabled": "true", "eks.amazonaws.com/compute-type": "hybrid"}, None),
    ({"eniipam.io/enabled": "true", "kubernetes.io/os": "windows"}, None),
    ({"eks.amazonaws.com/compute-type": "ec2"}, "aws-node"),
]
for extra, want in cases:
    labels = {**base, **extra}
    got = [n for n, spec in (("eniipam", eniipam), ("aws-node", patched)) if selects(spec, labels)]
    if got != ([want] if want else []):
        sys.exit(f"node labels {labels}: selected by {got or 'nothing'}, want {want or 'nothing'}")
PY
)"; then
  ok "eniipam and aws-node + $DEPLOY/aws-node-exclude-eniipam.patch.json select complementary nodes"
else
  fail "$DEPLOY/aws-node-exclude-eniipam.patch.json" "$out"
fi

# 6. One name for the socket variable.
if grep -nE 'ENIIPAM_SOCKET([^_]|$)' "$DEPLOY"/*.yaml; then
  fail "$DEPLOY" "the socket variable is ENIIPAM_SOCKET_PATH (what eniipamd and eniipamctl read)"
else
  ok "$DEPLOY: the socket variable is ENIIPAM_SOCKET_PATH everywhere"
fi

# 7. The NetworkProfile CRD's schema refuses what eniipamd refuses (src/network_profiles/profile.rs):
#    sample objects, good and bad, against its openAPIV3Schema. JSON Schema has no CEL and no
#    x-kubernetes-list-type, so the schema's known extensions are translated (set -> uniqueItems, the
#    two CEL rules -> their JSON Schema equivalents); an unknown CEL rule fails the check.
if out="$("$VENV/bin/python" - "$DEPLOY/networkprofile-crd.yaml" 2>&1 <<'PY'
import copy, sys, yaml, jsonschema
crd = yaml.safe_load(open(sys.argv[1]))
schema = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
KNOWN = {
    "size(self.metadata.name) <= 55": lambda s: s["properties"]["metadata"].update(
        {"properties": {"name": {"type": "string", "maxLength": 55}}}),
    "self.all(k, size(k) >= 1 && size(k) <= 128)": lambda s: s.update(
        {"propertyNames": {"minLength": 1, "maxLength": 128}}),
}
def translate(s):
    if isinstance(s, dict):
        for rule in s.pop("x-kubernetes-validations", []):
            if rule["rule"] not in KNOWN:
                sys.exit(f"unknown CEL rule {rule['rule']!r}: translate it here")
            KNOWN[rule["rule"]](s)
        if s.pop("x-kubernetes-list-type", None) == "set":
            s["uniqueItems"] = True
        for v in list(s.values()):
            translate(v)
    elif isinstance(s, list):
        for v in s:
            translate(v)
translate(schema)
sg = ["sg-0123abcd"]
def obj(spec, name="db"):
    return {"apiVersion": "eniipam.io/v1alpha1", "kind": "NetworkProfile", "metadata": {"name": name}, "spec": spec}
good = [
    obj({"subnet": "subnet-0a1b2c3d4e5f60718", "securityGroups": ["sg-0123abcd", "sg-4567ef01"], "maxEnisPerNode": 2}),
    obj({"subnetSelector": {"tags": {"tier": "db"}}, "securityGroups": sg}),
    obj({"subnet": "subnet-0123abcd", "securityGroups": sg}, name="a" * 55),
    obj({"subnet": "subnet-0123abcd", "securityGroups": sg, "egressMode": "strict"}),
    obj({"subnet": "subnet-0123abcd", "securityGroups": sg, "egressMode": "standard"}),
]
bad = {
    "no spec": {"apiVersion": "eniipam.io/v1alpha1", "kind": "NetworkProfile", "metadata": {"name": "db"}},
    "no subnet": obj({"securityGroups": sg}),
    "both": obj({"subnet": "subnet-0123abcd", "subnetSelector": {"tags": {"a": "b"}}, "securityGroups": sg}),
    "bad subnet": obj({"subnet": "subnet-xyz", "securityGroups": sg}),
    "no tags": obj({"subnetSelector": {}, "securityGroups": sg}),
    "empty tags": obj({"subnetSelector": {"tags": {}}, "securityGroups": sg}),
    "tag not a string": obj({"subnetSelector": {"tags": {"tier": 1}}, "securityGroups": sg}),
    "long tag key": obj({"subnetSelector": {"tags": {"k" * 129: "v"}}, "securityGroups": sg}),
    "no groups": obj({"subnet": "subnet-0123abcd"}),
    "empty groups": obj({"subnet": "subnet-0123abcd", "securityGroups": []}),
    "six groups": obj({"subnet": "subnet-0123abcd", "securityGroups": [f"sg-0000000{i}" for i in range(1, 7)]}),
    "bad group": obj({"subnet": "subnet-0123abcd", "securityGroups": ["default"]}),
    "group twice": obj({"subnet": "subnet-0123abcd", "securityGroups": sg * 2}),
    "maxEnis 0": obj({"subnet": "subnet-0123abcd", "securityGroups": sg, "maxEnisPerNode": 0}),
    "maxEnis string": obj({"subnet": "subnet-0123abcd", "securityGroups": sg, "maxEnisPerNode": "2"}),
    "bad egressMode": obj({"subnet": "subnet-0123abcd", "securityGroups": sg, "egressMode": "Standard"}),
    "long name": obj({"subnet": "subnet-0123abcd", "securityGroups": sg}, name="a" * 56),
}
v = jsonschema.Draft7Validator(schema)
for o in good:
    errs = list(v.iter_errors(o))
    if errs:
        sys.exit(f"refuses a good profile {o['spec']}: {errs[0].message}")
for why, o in bad.items():
    if v.is_valid(o):
        sys.exit(f"accepts a bad profile ({why}): {o.get('spec')}")
PY
)"; then
  ok "$DEPLOY/networkprofile-crd.yaml (its schema refuses what eniipamd refuses)"
else
  fail "$DEPLOY/networkprofile-crd.yaml" "$out"
fi

# 8. Shell scripts.
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
