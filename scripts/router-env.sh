#!/usr/bin/env bash
# Build a virtual environment holding the real sglang-router (SGLang's model gateway, a
# Rust binary in a Python wheel; CPU only), for the router tests and benchmarks.
#
#   scripts/router-env.sh [DIR]     (default: .venv-router)
#
# Its own environment: the router pins fastapi/uvicorn/pydantic versions the daemon does
# not need, and the daemon never imports it (it only speaks to it over HTTP).
set -euo pipefail
dir=${1:-.venv-router}
version=${SGLANG_ROUTER_VERSION:-0.3.2}
stamp="$dir/.sglang-router-$version"
if [ -f "$stamp" ]; then
  exit 0
fi
python3 -m venv "$dir"
"$dir/bin/pip" install -q --disable-pip-version-check "sglang-router==$version"
"$dir/bin/python" -c "import sglang_router.launch_router"
touch "$stamp"
echo "sglang-router $version ready in $dir"
