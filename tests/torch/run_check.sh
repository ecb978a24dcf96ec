#!/bin/sh
# Runs one PyTorch numerics check: the C++ driver writes its files into a
# fresh temporary directory, check_model.py compares them against PyTorch.
# Registered as ctest tests torch_<model> by tests/more.cmake.
#
#   tests/torch/run_check.sh build/tests/torch_check gpt
#
# Fails (never skips) when /usr/bin/python3 cannot import torch: the check is
# part of the test suite, and scripts/install-deps.sh installs python3-torch.
set -eu
if [ $# -ne 2 ]; then
  echo "usage: $0 TORCH_CHECK_BINARY MODEL" >&2
  exit 2
fi
driver=$1
model=$2
here=$(cd "$(dirname "$0")" && pwd)
py=${MESHFLOW_TORCH_PYTHON:-/usr/bin/python3}

if ! "$py" -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "torch_$model: FAIL: $py cannot import torch and numpy." >&2
  echo "The PyTorch numerics check needs Debian's python3-torch (CPU, 1.13) and python3-numpy" >&2
  echo "installed for /usr/bin/python3 (not a pyenv/venv python): run scripts/install-deps.sh" >&2
  exit 1
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/meshflow_torch_${model}.XXXXXX")
"$driver" "$model" "$dir"
if "$py" "$here/check_model.py" "$dir"; then
  rm -rf "$dir"
else
  echo "torch_$model: files kept in $dir" >&2
  exit 1
fi
