#!/usr/bin/env bash
# Install everything the tests need, then run lint, type checks and the whole test suite.
# Fails (non-zero) on the first failing step. Used as-is by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
t0=$SECONDS
# Debian's packages the later steps need, installed in the background from the start (one
# apt-get: its lock allows no other) while the Python environments install; each step
# below still installs what it lacks itself, so a failure here only costs time.
apt_log=$(mktemp /tmp/sgsup-apt.XXXXXX)
apt_pid=""
apt_need=()
for pair in chromium:chromium fish:fish zsh:zsh slurmctld:slurm-wlm munged:munge \
  promtool:prometheus amtool:prometheus-alertmanager kubectl:kubernetes-client; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] \
    || apt_need+=("${pair#*:}")
done
if ((${#apt_need[@]})) && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing ${apt_need[*]} (apt-get, in the background)"
  (
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${apt_need[@]}" \
      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${apt_need[@]}"; } \
      || { dpkg --configure -a && apt-get install -y -qq --no-install-recommends "${apt_need[@]}"; }
  ) >"$apt_log" 2>&1 &
  apt_pid=$!
fi
apt_done() {  # before the first step that uses a Debian package
  [ -n "$apt_pid" ] || return 0
  if wait "$apt_pid"; then
    echo "   Debian packages installed ($((SECONDS - t0)) s after the start)"
  else
    echo "   the background apt-get failed (the steps retry on their own):" >&2
    tail -n 20 "$apt_log" >&2
  fi
  apt_pid=""
}
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q -e '.[test]'
# SGLang's and the router's environments install (mostly downloads) while the benchmarks
# that need neither run (CPU): their logs are printed once both are done.
envs_log=$(mktemp /tmp/sgsup-envs.XXXXXX)
(
  echo "== SGLang parser environment (.venv-sglang)"
  bash scripts/sglang-parser-env.sh .venv-sglang
  echo "== sglang-router environment (.venv-router)"
  bash scripts/router-env.sh .venv-router
) >"$envs_log" 2>&1 &
envs_pid=$!
echo "== benchmarks (smoke: each runs once in its quickest form; figures printed, not asserted)"
# A benchmark that no longer runs fails here (a fresh clone's `--only swap` did). Saves nothing.
bench_t0=$SECONDS
.venv/bin/python -m tests.benchmarks.run --smoke --no-save \
  --only teardown --only orphans --only swap --only api --only footprint
.venv/bin/python -m tests.benchmarks.bench_sim_load --seconds 15
.venv/bin/python -m tests.benchmarks.h200 --dry-run --reps8 1 --reps48 1 --budget-s 60 \
  --out "$(mktemp -d)"
envs_rc=0
wait "$envs_pid" || envs_rc=$?
cat "$envs_log"
if [ "$envs_rc" != 0 ]; then
  echo "the SGLang or router environment did not install (exit $envs_rc): see above" >&2
  exit "$envs_rc"
fi
echo "   benchmarks smoke, first part: $((SECONDS - bench_t0)) s (the environments installed meanwhile)"
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== sdist and wheel (python -m build, twine check)"
# What the README's install recipe does (the package is not on PyPI): a build that breaks
# (a missing package in pyproject.toml's list, a README PyPI cannot render) fails here.
dist_dir=$(mktemp -d /tmp/sgsup-dist.XXXXXX)
.venv/bin/python -m build --outdir "$dist_dir/dist" . >"$dist_dir/build.log" 2>&1 || {
  tail -n 40 "$dist_dir/build.log" >&2
  exit 1
}
.venv/bin/twine check --strict "$dist_dir"/dist/*
# The wheel is what a host installs: it must carry the data files and the page, and no
# top-level package but the two (a stray 'supervisor' would shadow PyPI's Supervisord).
.venv/bin/python - "$dist_dir"/dist/*.whl <<'EOF'
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["sglang_supervisor/data/sglang-0.5.23.json", "sglang_supervisor_api/static/status.html"]
missing = [n for n in need if n not in names]
tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
if missing or tops != {"sglang_supervisor", "sglang_supervisor_api"}:
    sys.exit(f"wheel {sys.argv[1]}: missing {missing}; top-level entries {sorted(tops)}")
print(f"   {sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files")
EOF
rm -rf "$dist_dir"
apt_done
echo "== deploy assets (promtool, amtool, systemd-analyze, kubectl, kubernetes-validate)"
bash scripts/check-deploy.sh
echo "== chromium (the status page's browser test)"
# Debian's chromium drives tests/integration/test_status_page.py; installed when missing
# and this runs as root (the test skips without it, and fails under CI=true).
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/lib/chromium/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
  else
    echo "   chromium missing and not root: the status page test will be skipped"
  fi
fi
echo "== fish and zsh (the completion tests run the real shells)"
# Debian's fish and zsh, installed when missing and this runs as root; without them their
# tests are skipped loudly (and fail under CI=true).
for shell in fish zsh; do
  if ! command -v "$shell" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$shell" >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$shell" >/dev/null; }
    else
      echo "   $shell missing and not root: its completion test will be skipped"
    fi
  fi
done
echo "== a two-node Slurm cluster on this machine (the multi-host tests)"
# Debian's slurm-wlm + munge, installed when missing and this runs as root; free ports are
# picked so another cluster on this host (a developer's, another run's) never collides.
# The tests needing it skip without it, and fail under CI=true.
slurm_dir=$(mktemp -d /tmp/sgsup-slurm.XXXXXX)
if slurm_env=$(bash scripts/slurm-cluster.sh start "$slurm_dir"); then
  slurm_env=$(printf '%s\n' "$slurm_env" | tail -n 1)
  export SGLANG_SUPERVISOR_TEST_SLURM_CONF="${slurm_env#export SLURM_CONF=}"
  trap 'bash scripts/slurm-cluster.sh stop "$slurm_dir" || true' EXIT
elif [ "${CI:-}" = true ]; then
  echo "CI: the Slurm test cluster did not start (logs in $slurm_dir/log)" >&2
  exit 1
else
  echo "   no Slurm cluster: the multi-host tests will be skipped (logs in $slurm_dir/log)"
fi
export SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON="$PWD/.venv-sglang/bin/python"
export SGLANG_SUPERVISOR_TEST_ROUTER_PYTHON="$PWD/.venv-router/bin/python"
echo "   ready for the tests $((SECONDS - t0)) s after the start"
# The benchmarks that need SGLang's or the router's environment run beside the tests
# (they mostly wait on servers too); their figures are printed after the tests, and a
# benchmark that fails fails the run.
bench2_log=$(mktemp /tmp/sgsup-bench2.XXXXXX)
(
  set -e
  t=$SECONDS
  .venv/bin/python -m tests.benchmarks.run --smoke --no-save --only startup
  .venv/bin/python -m tests.benchmarks.bench_validate --rounds 1 --colds 1
  .venv/bin/python -m tests.benchmarks.bench_router --only integration --duration 3 \
    --concurrency 2 --replicas 2 --no-save
  echo "   benchmarks smoke, second part: $((SECONDS - t)) s (beside the tests)"
) >"$bench2_log" 2>&1 &
bench2_pid=$!
echo "== pytest"
# Three workers (pytest-xdist; PYTEST_WORKERS to change, 0 for none): the tests mostly
# wait on daemons and simulated servers; work stealing keeps a worker that finished early
# busy with another's queue. The slowest 15 are listed at the end.
pytest_rc=0
.venv/bin/pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-3}" --dist worksteal \
  --durations=15 "$@" || pytest_rc=$?
bench2_rc=0
wait "$bench2_pid" || bench2_rc=$?
echo "== benchmarks (smoke, second part: startup, validate, router)"
cat "$bench2_log"
if [ "$bench2_rc" != 0 ]; then
  echo "a benchmark of the second part failed (exit $bench2_rc): see above" >&2
fi
echo "   the whole run: $((SECONDS - t0)) s"
if [ "$pytest_rc" != 0 ]; then
  exit "$pytest_rc"
fi
exit "$bench2_rc"
