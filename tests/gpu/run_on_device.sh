#!/usr/bin/env bash
# Run the GPU tests on a GPU host that has torch with CUDA but nothing of this project's
# dependencies and no network (the workplace's device machine). Wheels travel in .whl/:
#   .whl/sglang-0.5.23-cp312-*.whl       -> /tmp/sgl  (SGLang alone: SGS_E2E_SGLANG_SITE)
#   every other .whl/*.whl               -> /tmp/site (the daemon's and SGLang's parser deps)
# How .whl/ is filled: tests/gpu/README.md. Results and logs go to $OUT (default /tmp/out).
#
#   bash tests/gpu/run_on_device.sh [pytest args...]     (default: the end-to-end test)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
mapfile -t deps < <(ls .whl/*.whl | grep -v '/sglang-')
pipi --upgrade --target /tmp/site "${deps[@]}" || exit 1
pipi --target /tmp/sgl .whl/sglang-*.whl || exit 1
# Our packages under their import names: .typecheck/ holds symlinks to supervisor/
# and api/ (nothing of ours is pip-installed here).
export PYTHONPATH=/tmp/site:$PWD/.typecheck SGS_E2E_SGLANG_SITE=/tmp/sgl PYTHONUNBUFFERED=1
export SGS_E2E_RESULTS="$OUT/daemon_e2e.json"
{
  date -u
  nvidia-smi -L
  nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,driver_version --format=csv
  python3 -c 'import sys, torch; print(sys.version, torch.__version__, torch.cuda.device_count())'
  python3 -c 'import sys; sys.path.insert(0, "/tmp/sgl"); import fastapi, uvicorn
from sglang.srt.server_args import ServerArgs; print("SGLang server_args imports")'
} >"$OUT/host.txt" 2>&1
cat "$OUT/host.txt"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(tests/gpu/test_daemon_e2e.py)
python3 -m pytest -p no:cacheprovider -q -s -rs --basetemp=/tmp/e2e-base "${args[@]}" \
  2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
# The daemons' logs and the servers' launch logs, for a failed step.
tar czf "$OUT/e2e-logs.tgz" --exclude='server-venv' -C /tmp e2e-base 2>/dev/null
nvidia-smi >"$OUT/nvidia-smi-after.txt" 2>&1
exit "$rc"
