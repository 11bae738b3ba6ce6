#!/usr/bin/env bash
# Build a virtual environment holding SGLang's *argument parser* (no GPU packages), for
# validating levers with SGLang's own parser on a machine without a GPU (tests, CI).
#
#   scripts/sglang-parser-env.sh [DIR]     (default: .venv-sglang)
#
# SGLang is installed with --no-deps, then only what importing
# sglang.srt.server_args needs, with torch 2.13.0: ~2.3 GB, ~1 minute where pip finds that
# release's CPU build (as on this project's machines). Elsewhere plain PyPI serves the CUDA
# build of torch: it works the same for parsing, only several GB larger.
set -euo pipefail
dir=${1:-.venv-sglang}
version=${SGLANG_VERSION:-0.5.23}
stamp="$dir/.sglang-parser-$version"
if [ -f "$stamp" ]; then
  exit 0
fi
python3 -m venv "$dir"
"$dir/bin/pip" install -q --disable-pip-version-check --no-deps "sglang==$version"
"$dir/bin/pip" install -q --disable-pip-version-check torch==2.13.0 triton numpy orjson psutil \
  pybase64 requests packaging pillow starlette pydantic pyzmq tqdm ipython aiohttp msgspec
"$dir/bin/python" -c "from sglang.srt.server_args import ServerArgs, prepare_server_args"
touch "$stamp"
echo "SGLang $version parser environment ready in $dir"
