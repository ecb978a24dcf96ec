#!/bin/sh
# Runs an MPI job in which one rank fails and checks that the whole job ends
# non-zero within 30 s with output naming the failed rank (never a hang).
#   expect_failure.sh RANK mpirun ARGS...
# `timeout 60` bounds the job: a hang ends as status 124 and fails the test.
set -u
rank=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
timeout 60 "$@" >"$out" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$out"
echo "expect_failure: exit status $rc after ${elapsed} s"
if [ "$rc" -eq 0 ]; then
  echo "expect_failure: FAIL: the job exited 0 although rank $rank failed"; exit 1
fi
if [ "$rc" -eq 124 ] || [ "$elapsed" -gt 30 ]; then
  echo "expect_failure: FAIL: the job took ${elapsed} s to end (limit 30 s): a hang"; exit 1
fi
if ! grep -Eq "rank $rank([^0-9]|\$)" "$out"; then
  echo "expect_failure: FAIL: no line of the output names rank $rank"; exit 1
fi
echo "expect_failure: ok"
