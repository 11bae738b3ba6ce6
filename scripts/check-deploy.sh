#!/usr/bin/env bash
# Check the deployment assets with the tools that will read them:
#   promtool check config   deploy/prometheus/prometheus.yml (+ the rule file it loads)
#   promtool check rules    deploy/prometheus/alerts.yml
#   promtool test rules     deploy/prometheus/alerts_test.yml (alerts fire when they should,
#                           and the incident scenarios page once, or not at all)
#   amtool check-config     deploy/prometheus/alertmanager.example.yml (routing, inhibitions)
#   systemd-analyze verify  systemd/sglang-supervisor.service, with and without the drop-in
#   kubectl, kubernetes-validate  deploy/container/pod.yaml (parsed offline; Kubernetes'
#                           schemas, strict). The Containerfile: tests/unit/test_container_assets.py
# That every metric the alerts and the dashboard use is one the daemon exports is checked
# by tests/integration/test_deploy.py (it needs a running daemon).
#
# promtool comes from Debian's `prometheus` package, amtool from `prometheus-alertmanager`,
# systemd-analyze from `systemd`, kubectl from `kubernetes-client`. When
# one is missing the script installs it with apt-get if it runs as root, fails under CI=true
# otherwise, and skips (exit 0, saying so) for a developer without root. Note: on a host
# booted with systemd, installing Debian's prometheus package also starts a Prometheus
# server and prometheus-alertmanager an Alertmanager (`systemctl disable --now prometheus
# prometheus-alertmanager` if you do not want them). tests/integration/test_alertmanager.py
# runs the Alertmanager binary against deploy/prometheus/alertmanager.example.yml.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v amtool >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing ${missing[*]} (apt-get)"
    started=$SECONDS
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    echo "   installed in $((SECONDS - started)) s"
  elif [ "${CI:-}" = true ]; then
    echo "check-deploy: FAILED: promtool/amtool/systemd-analyze missing (Debian packages:" \
      "${missing[*]}) and they cannot be installed here (needs root and apt-get)" >&2
    exit 1
  else
    echo "check-deploy: SKIPPED: needs promtool, amtool and systemd-analyze; install the Debian" \
      "packages (apt-get install ${missing[*]}) or run this script as root" >&2
    exit 0
  fi
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== promtool check config deploy/prometheus/prometheus.yml"
# The scrape job reads the daemon's read-only token from
# /etc/prometheus/sglang-supervisor-read.token, which promtool requires to exist: check a
# copy that points at a placeholder token instead.
mkdir "$tmp/prometheus"
cp deploy/prometheus/alerts.yml "$tmp/prometheus/"
printf 'placeholder-token\n' >"$tmp/prometheus/token"
sed "s#credentials_file: /etc/prometheus/sglang-supervisor-read.token#credentials_file: $tmp/prometheus/token#" \
  deploy/prometheus/prometheus.yml >"$tmp/prometheus/prometheus.yml"
grep -q "credentials_file: $tmp/prometheus/token" "$tmp/prometheus/prometheus.yml" || {
  echo "check-deploy: prometheus.yml no longer names" \
    "/etc/prometheus/sglang-supervisor-read.token; update this script" >&2
  exit 1
}
promtool check config "$tmp/prometheus/prometheus.yml"

echo "== promtool check rules deploy/prometheus/alerts.yml"
promtool check rules deploy/prometheus/alerts.yml

echo "== promtool test rules deploy/prometheus/alerts_test.yml"
promtool test rules deploy/prometheus/alerts_test.yml

echo "== amtool check-config deploy/prometheus/alertmanager.example.yml"
amtool check-config deploy/prometheus/alertmanager.example.yml

echo "== PromQL of deploy/grafana/sglang-supervisor.json (as recording rules, promtool check rules)"
# Grafana's variables replaced by values of the same kind, each panel query becomes a
# recording rule: promtool then parses every expression the dashboard runs.
python3 - "$tmp/dashboard-rules.yml" <<'EOF'
import json
import sys

with open("deploy/grafana/sglang-supervisor.json") as f:
    dashboard = json.load(f)
exprs = []
for panel in dashboard["panels"]:
    for target in panel.get("targets", []):
        expr = target["expr"]
        for var, value in (("$__rate_interval", "1m"), ("$__range", "6h"), ("$instance", ".*")):
            expr = expr.replace(var, value)
        exprs.append(expr)
if not exprs:
    sys.exit("no panel queries found in the dashboard")
with open(sys.argv[1], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, expr in enumerate(exprs):
        out.write(f"      - record: dashboard:query_{i}\n        expr: {json.dumps(expr)}\n")
print(f"  {len(exprs)} queries")
EOF
promtool check rules "$tmp/dashboard-rules.yml"

# systemd-analyze verify exits 0 on unknown keys and unparsable values (it only prints
# them), and fails when ExecStart's program does not exist. So: verify a copy whose
# programs point at a stub, and treat any output as a failure. User=sglang need not exist.
verify() {
  local dir=$1 out
  out=$(systemd-analyze verify --man=no "$dir/sglang-supervisor.service" 2>&1) || {
    printf '%s\n' "$out" >&2
    return 1
  }
  if [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    return 1
  fi
}
stub="$tmp/bin/sglang-supervisor"
mkdir -p "$tmp/bin"
printf '#!/bin/sh\nexit 0\n' >"$stub"
chmod +x "$stub"
stage() { # stage DIR [with-drop-in]: the unit (and the drop-in) with ExecStart & co. on the stub
  mkdir -p "$1"
  sed "s#/opt/sglang-supervisor/bin/sglang-supervisor#$stub#g" \
    systemd/sglang-supervisor.service >"$1/sglang-supervisor.service"
  if [ "${2:-}" = with-drop-in ]; then
    mkdir -p "$1/sglang-supervisor.service.d"
    for f in systemd/sglang-supervisor.service.d/*.conf; do
      sed "s#/opt/sglang-supervisor/bin/sglang-supervisor#$stub#g" "$f" \
        >"$1/sglang-supervisor.service.d/$(basename "$f")"
    done
  fi
}

echo "== systemd-analyze verify systemd/sglang-supervisor.service"
stage "$tmp/unit"
verify "$tmp/unit"

echo "== systemd-analyze verify systemd/sglang-supervisor.service + sglang-supervisor.service.d/"
stage "$tmp/unit-drop-in" with-drop-in
verify "$tmp/unit-drop-in"

# The verification above must be able to fail: a copy with a misspelt directive must not pass.
stage "$tmp/broken"
sed -i 's/^KillMode=mixed$/KillMode=bogus/' "$tmp/broken/sglang-supervisor.service"
if verify "$tmp/broken" 2>/dev/null; then
  echo "check-deploy: systemd-analyze verify accepted KillMode=bogus: the unit check" \
    "is not checking anything" >&2
  exit 1
fi

echo "== deploy/container/pod.yaml: kubectl (parse, offline) and kubernetes-validate (schema)"
# kubectl's client-side dry runs (create/apply --dry-run=client) still ask an API server
# for its resource list; `label --local` reads every document offline through kubectl's
# own decoder (a YAML or kind/apiVersion error fails it) and prints each object's name.
# Its checks are shallow: the schema check is kubernetes-validate's (PyPI, Kubernetes'
# OpenAPI schemas bundled: --strict also refuses unknown fields, a misspelt probe key).
kubectl label --local -f deploy/container/pod.yaml checked=yes -o name
kvalidate=.venv/bin/kubernetes-validate
[ -x "$kvalidate" ] || kvalidate=$(command -v kubernetes-validate || true)
if [ -z "$kvalidate" ]; then
  echo "check-deploy: FAILED: kubernetes-validate missing (pip install -e '.[test]')" >&2
  exit 1
fi
"$kvalidate" --strict deploy/container/pod.yaml
# ... and must be able to fail: a misspelt field and a string port are refused.
sed 's/^        periodSeconds: 5$/        periodSecond: 5/; s/containerPort: 8470/containerPort: "8470"/' \
  deploy/container/pod.yaml >"$tmp/pod-broken.yaml"
if "$kvalidate" --strict --quiet "$tmp/pod-broken.yaml" >/dev/null 2>&1; then
  echo "check-deploy: kubernetes-validate accepted a misspelt probe field and a string" \
    "port: the pod check is not checking anything" >&2
  exit 1
fi

echo "check-deploy: OK"
