#!/usr/bin/env bash
# Checks the Helm chart offline (no cluster needed or used), for scripts/test.sh:
#   1. `helm lint --strict` with the defaults and with every values file in silt/ci/;
#   2. `helm template` of each, and every rendered object validated against the Kubernetes
#      API's JSON schemas, strictly (unknown fields are errors), for the oldest and newest
#      Kubernetes versions the validator ships (kubernetes-validate from PyPI carries the
#      schemas; an object whose kind it has no schema for fails the check too);
#   3. every SILT_* variable the chart sets and every key of its config file is an option of
#      docs/CONFIGURATION.md (which a unit test keeps equal to the binary's own table), and
#      the roles it starts are commands of the CLI;
#   4. every values file in invalid/ is refused (values.schema.json, or the templates).
# Needs helm and kubernetes-validate (scripts/install-deps.sh puts them in .deps).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
helm=${HELM:-$root/.deps/bin/helm}
venv=${SILT_K8S_VENV:-$root/.deps/k8svenv}
chart="$root/deploy/helm/silt"
# The oldest and newest schemas kubernetes-validate 1.37 ships.
k8s_versions=(1.25.0 1.37.0)
[ -x "$helm" ] || { echo "helm check: $helm is missing (scripts/install-deps.sh)" >&2; exit 1; }
[ -x "$venv/bin/kubernetes-validate" ] ||
  { echo "helm check: $venv/bin/kubernetes-validate is missing (scripts/install-deps.sh)" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failed=0
fail() { echo "helm check: FAIL: $*" >&2; failed=$((failed + 1)); }

# The names the chart may use: SILT_ + each option of docs/CONFIGURATION.md's table, and
# SILT_CONFIG (the config file). Roles: the commands `silt` has.
sed -n 's/^| `\([a-z0-9_]*\)` |.*/\1/p' "$root/docs/CONFIGURATION.md" >"$out/options"
[ -s "$out/options" ] || { echo "helm check: no options found in docs/CONFIGURATION.md" >&2; exit 1; }
grep -q 'SILT_CONFIG' "$root/docs/CONFIGURATION.md" ||
  { echo "helm check: docs/CONFIGURATION.md no longer names SILT_CONFIG" >&2; exit 1; }

if ! "$helm" lint --strict "$chart" >"$out/lint" 2>&1; then
  cat "$out/lint" >&2
  fail "helm lint (defaults)"
fi

checked=0
for values in "$chart"/ci/*.yaml; do
  name=$(basename "$values" .yaml)
  if ! "$helm" lint --strict "$chart" -f "$values" >"$out/lint" 2>&1; then
    cat "$out/lint" >&2
    fail "helm lint -f ci/$name.yaml"
    continue
  fi
  rendered="$out/$name.yaml"
  if ! "$helm" template silt "$chart" --namespace silt-ci -f "$values" >"$rendered" 2>"$out/err"; then
    cat "$out/err" >&2
    fail "helm template -f ci/$name.yaml"
    continue
  fi
  for v in "${k8s_versions[@]}"; do
    # --quiet prints only warnings and failures: any output (such as a kind with no schema)
    # fails the check as well as the exit status does.
    if ! "$venv/bin/kubernetes-validate" --strict --quiet -k "$v" "$rendered" >"$out/val" 2>&1 ||
      [ -s "$out/val" ]; then
      cat "$out/val" >&2
      fail "ci/$name.yaml: rendered objects against the Kubernetes $v schemas"
    fi
  done
  if ! "$venv/bin/python" - "$rendered" "$out/options" >"$out/names" 2>&1 <<'PY'; then
import sys, tomllib, yaml

rendered, options = sys.argv[1], sys.argv[2]
known = {line.strip() for line in open(options) if line.strip()}
env_ok = {"SILT_" + o.upper() for o in known} | {"SILT_CONFIG"}
roles = {"worker", "csi", "up"}
docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
bad = []
for d in docs:
    kind, name = d["kind"], d["metadata"]["name"]
    if kind == "ConfigMap" and "silt.toml" in d.get("data", {}):
        for key in tomllib.loads(d["data"]["silt.toml"]):
            if key not in known:
                bad.append(f"{kind}/{name}: config key {key!r} is no option")
    spec = d.get("spec", {}).get("template", {}).get("spec", {})
    for c in spec.get("containers", []):
        image = c["image"].split(":")[0]
        # etcd, and the Kubernetes CSI sidecars (node-driver-registrar, external-provisioner).
        if image.endswith("etcd") or image.startswith("registry.k8s.io/sig-storage/"):
            continue
        args = c.get("args", [])
        if not args or args[0] not in roles:
            bad.append(f"{kind}/{name}/{c['name']}: starts {args[:1]}, not a silt role")
        for e in c.get("env", []):
            n = e["name"]
            if n.startswith("SILT_") and n not in env_ok:
                bad.append(f"{kind}/{name}/{c['name']}: {n} is no option")
    # A StorageClass's parameters become volume attributes (docs/csi.md): Silt options,
    # uri, path, basePath, or Kubernetes' own prefixed keys.
    if kind == "StorageClass":
        for key in d.get("parameters", {}):
            if "/" not in key and key not in known | {"uri", "path", "basePath"}:
                bad.append(f"{kind}/{name}: parameter {key!r} is no volume attribute")
for b in bad:
    print(b)
print(f"{len(docs)} objects")
sys.exit(1 if bad else 0)
PY
    cat "$out/names" >&2
    fail "ci/$name.yaml: names the chart passes to silt"
    continue
  fi
  checked=$((checked + 1))
  echo "helm check: ci/$name.yaml: lint, template, $(tail -1 "$out/names") valid against Kubernetes ${k8s_versions[*]}, names known" >&2
done

for values in "$root"/deploy/helm/invalid/*.yaml; do
  name=$(basename "$values")
  if "$helm" template silt "$chart" --namespace silt-ci -f "$values" >/dev/null 2>"$out/err"; then
    fail "invalid/$name was accepted: $(head -1 "$values")"
  else
    echo "helm check: invalid/$name refused: $(grep -m1 -E 'at |error' "$out/err" | sed 's/^ *//')" >&2
  fi
done

[ "$checked" -gt 0 ] || fail "no values file in $chart/ci was checked"
if [ "$failed" -gt 0 ]; then
  echo "helm check: $failed failed" >&2
  exit 1
fi
echo "helm check: ok ($checked values files; $(ls "$root"/deploy/helm/invalid/*.yaml | wc -l) invalid ones refused)" >&2
