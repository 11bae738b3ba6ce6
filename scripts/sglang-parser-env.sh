#!/usr/bin/env bash
# Build the TEST environment of SGLang 0.5.23 for a machine without a GPU: its argument
# parser and its launch-time resolution pipeline (ServerArgs.resolve_once and
# check_server_args), which the supervisor runs before it stops a server.
#
#   scripts/sglang-parser-env.sh [DIR]     (default: .venv-sglang)
#
# SGLang is installed with --no-deps, then only what importing
# sglang.srt.server_args and the resolution pipeline needs, with torch 2.13.0 (the CPU
# build where pip finds it, as on this project's machines; elsewhere plain PyPI serves the
# CUDA build, which works the same here, only several GB larger) and transformers.
# GPU-only kernel modules (sgl_kernel, flashinfer, tvm_ffi) and torchvision are stubbed
# by tests/sglang_stubs/sglang_test_stubs.py, installed with a .pth line: in this test
# environment only, never in production, where SGLang is whole.
# Measured on the project's 2-core machine: ~2 min, ~2.6 GB.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-.venv-sglang}
version=${SGLANG_VERSION:-0.5.23}
stamp="$dir/.sglang-resolve-$version"
if [ -f "$stamp" ]; then
  exit 0
fi
python3 -m venv "$dir"
pip=("$dir/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" --no-deps "sglang==$version"
"${pip[@]}" torch==2.13.0 triton numpy orjson psutil pybase64 requests packaging pillow \
  starlette pydantic pyzmq tqdm ipython aiohttp msgspec
# What the resolution pipeline imports (model configs, quantization configs), at the
# versions SGLang 0.5.23 pins where it pins them.
"${pip[@]}" transformers==5.19.0 tokenizers==0.23.2 sentencepiece dill gguf \
  compressed-tensors
site=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp "$here/tests/sglang_stubs/sglang_test_stubs.py" "$site/"
echo "import sglang_test_stubs" >"$site/sglang_test_stubs.pth"
# transformers asks the metadata for torchvision's version before it imports it.
mkdir -p "$site/torchvision-0.28.0.dist-info"
printf 'Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n' \
  >"$site/torchvision-0.28.0.dist-info/METADATA"
"$dir/bin/python" -c "
from sglang.srt.server_args import ServerArgs, prepare_server_args
import sglang.srt.arg_groups.pipeline"
touch "$stamp"
echo "SGLang $version test environment (parser + resolution) ready in $dir"
