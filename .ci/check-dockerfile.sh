#!/usr/bin/env bash
# Checks deploy/Dockerfile without Docker (none runs here), offline:
#   1. every COPY source (the build context is the repository root) exists;
#   2. every base image is pinned by digest (FROM, and the ARG defaults FROM uses), and every download
#      in a RUN is verified with `sha256sum -c`;
#   3. the workspace resolves from EXACTLY the files the Dockerfile copies: they are copied to a temp
#      dir laid out as the builder's WORKDIR, and `cargo metadata --offline --locked` runs there;
#   4. each `cargo build` in the Dockerfile names packages and binaries that exist there, and what the
#      image ships keeps its promises: the daemon built with --no-default-features has no mockcloud,
#      and the plugin's dependency tree has no AWS SDK, SQLite, axum, governor or mockcloud.
# Exits non-zero on any failure, naming it. Needs python3 and cargo with the crates already in the
# local registry (any earlier build of the workspace fetched them).
set -euo pipefail
cd "$(dirname "$0")/.."

DOCKERFILE="${DOCKERFILE:-deploy/Dockerfile}"
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 - "$DOCKERFILE" "$work/context" "$TRIPLE" <<'PY'
import json, os, re, shlex, shutil, subprocess, sys

dockerfile, ctx, triple = sys.argv[1], sys.argv[2], sys.argv[3]
failures = []
def fail(msg): failures.append(msg); print(f"FAIL {msg}", file=sys.stderr)
def ok(msg): print(f"ok   {msg}")

# Instructions: continuation lines joined, comment lines dropped (also inside a continuation, as
# BuildKit does).
instructions, current = [], ""
for raw in open(dockerfile):
    line = raw.rstrip("\n")
    if line.lstrip().startswith("#"):
        continue
    if line.endswith("\\"):
        current += line[:-1] + " "
        continue
    current += line
    if current.strip():
        instructions.append(current.strip())
    current = ""

args, stages, workdir, copies, runs = {}, set(), "/", [], []
for ins in instructions:
    word, _, rest = ins.partition(" ")
    word = word.upper()
    if word == "ARG":
        name, eq, default = rest.partition("=")
        if eq:
            args[name.strip()] = default.strip()
    elif word == "FROM":
        parts = rest.split()
        image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), parts[0])
        if "AS" in [p.upper() for p in parts]:
            stages.add(parts[[p.upper() for p in parts].index("AS") + 1])
        if image in stages:
            ok(f"FROM {image} (an earlier stage)")
        elif re.search(r"@sha256:[0-9a-f]{64}$", image):
            ok(f"FROM {image.split('@')[0]} pinned by digest")
        else:
            fail(f"FROM {image}: not pinned by digest (@sha256:...)")
        workdir = "/"
    elif word == "WORKDIR":
        workdir = os.path.join(workdir, rest.strip())
    elif word in ("COPY", "ADD"):
        words = shlex.split(rest)
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        if word == "ADD" and any(p.startswith(("http://", "https://")) for p in paths) \
                and not any(f.startswith("--checksum=") for f in flags):
            fail(f"ADD {rest}: a download without --checksum")
        if any(f.startswith("--from=") for f in flags):
            continue
        *srcs, dest = paths
        for s in srcs:
            if os.path.exists(s):
                ok(f"COPY source {s} exists")
                copies.append((s, os.path.join(workdir, dest)))
            else:
                fail(f"COPY source {s} does not exist in the repository")
    elif word == "RUN":
        runs.append(rest)
        if re.search(r"\b(curl|wget)\b", rest) and "sha256sum -c" not in rest:
            fail(f"RUN downloads without sha256sum -c: {rest[:80]}...")

# The builder's WORKDIR as a temp dir holding only what was copied.
root = "/src"
for src, dest in copies:
    target = os.path.join(ctx, os.path.relpath(dest, root))
    if os.path.isdir(src):
        shutil.copytree(src, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("target"))
    else:
        if dest.endswith("/"):
            target = os.path.join(target, os.path.basename(src))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(src, target)

def cargo(*a):
    p = subprocess.run(["cargo", *a], cwd=ctx, capture_output=True, text=True,
                       env={**os.environ, "CARGO_TARGET_DIR": os.path.join(ctx, "target")})
    return p.returncode, p.stdout, p.stderr

code, out, err = cargo("metadata", "--offline", "--locked", "--format-version", "1",
                       "--filter-platform", triple)
if code != 0:
    fail("the workspace does not resolve from the copied files alone:\n" + err.strip())
    sys.exit(1)
ok("cargo metadata --offline --locked resolves the workspace from the copied files")
meta = json.loads(out)
members = {p["id"] for p in meta["packages"] if p["id"] in meta["workspace_members"]}
bins = {}
for p in meta["packages"]:
    if p["id"] in members:
        bins[p["name"]] = {t["name"] for t in p["targets"] if "bin" in t["kind"]}

# Scripts a RUN executes from the copied files (`bash crates/cni/build-plugin.sh ...`) must be among
# them, and their `cargo build` lines are checked like the Dockerfile's own.
for run in list(runs):
    for script in re.findall(r"\bbash\s+([\w./-]+\.sh)\b", run):
        copied = os.path.join(ctx, script)
        if os.path.isfile(copied):
            ok(f"script {script} run by the Dockerfile is in the copied files")
            runs.append(" ".join(l.rstrip("\\") for l in open(copied) if not l.lstrip().startswith("#")))
        else:
            fail(f"the Dockerfile runs {script}, which the COPY lines do not bring in")

for run in runs:
    for cmd in re.findall(r"cargo build[^;&|]*", run):
        w = cmd.split()
        pkgs = [w[i + 1] for i, x in enumerate(w) if x == "-p"]
        wanted = [w[i + 1] for i, x in enumerate(w) if x == "--bin"]
        for p in pkgs:
            if p not in bins:
                fail(f"`{cmd.strip()}`: no workspace package {p}")
                continue
            for b in wanted:
                if b not in bins[p]:
                    fail(f"`{cmd.strip()}`: package {p} has no binary {b} (has {sorted(bins[p])})")
                else:
                    ok(f"`cargo build -p {p} --bin {b}` names a real binary")

def tree(*a):
    code, out, err = cargo("tree", "--offline", "--locked", "-e", "normal", "--prefix", "none",
                           "--target", triple, *a)
    if code != 0:
        fail(f"cargo tree {' '.join(a)}: {err.strip()}")
        return set()
    return {l.split()[0] for l in out.splitlines() if l.strip()}

daemon = tree("-p", "eniipam", "--no-default-features")
if "mockcloud" in daemon:
    fail("eniipamd built with --no-default-features still depends on mockcloud")
elif daemon:
    ok("eniipamd without default features: no mockcloud")
plugin = tree("-p", "eniipam-cni")
banned = sorted(d for d in plugin
                if d.startswith("aws-") or d in ("rusqlite", "libsqlite3-sys", "axum", "governor", "mockcloud"))
if banned:
    fail(f"the plugin's dependency tree has {banned}")
elif plugin:
    ok("the plugin depends on no AWS SDK, SQLite, axum, governor or mockcloud")

if failures:
    print(f"check-dockerfile: {len(failures)} failure(s)", file=sys.stderr)
    sys.exit(1)
print("check-dockerfile: deploy/Dockerfile is consistent with the repository")
PY
