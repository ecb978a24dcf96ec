#!/bin/sh
# The Hugging Face interop check (tests/torch/hf_check.py says what it checks):
#   tests/torch/run_hf_check.sh build/tests/torch_check gpt2|llama
# Registered as ctest tests torch_hf_<model> by tests/more.cmake; fails (never
# skips) without Debian's python3-torch, as run_check.sh.
set -eu
driver=$1
model=$2
here=$(cd "$(dirname "$0")" && pwd)
py=${MESHFLOW_TORCH_PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "torch_hf_$model: FAIL: $py cannot import torch and numpy (run scripts/install-deps.sh)" >&2
  exit 1
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/meshflow_hf_${model}.XXXXXX")
"$py" "$here/hf_check.py" write "$dir" "$model"
"$driver" hf "$dir"
if "$py" "$here/hf_check.py" check "$dir"; then
  rm -rf "$dir"
else
  echo "torch_hf_$model: files kept in $dir" >&2
  exit 1
fi
