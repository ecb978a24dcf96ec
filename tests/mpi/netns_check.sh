#!/usr/bin/env bash
# A job that spans hosts, on this machine: two network namespaces (veth pairs
# on a bridge, 10.213.N.0/24; nothing leaves the machine) stand for two hosts,
# and mpirun starts one rank in each through an rsh agent that runs Open MPI's
# daemon with `ip netns exec` (registered by tests/mpi.cmake).
#   netns_check.sh MESHFLOW_BIN MPIRUN equal  the 2-host run equals --ranks 2 (losses, weights)
#   netns_check.sh MESHFLOW_BIN MPIRUN cut    host 2's link cut mid-run: every rank and mpirun
#                                             end within 30 s, non-zero, naming rank 1
# Needs root and `ip netns`; exits 77 (skipped) without them.
set -uo pipefail
BIN=$1 MPIRUN=$2 MODE=$3
[ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || { echo "SKIP: needs root and ip(8)"; exit 77; }
t=mf$(( $$ % 100000 ))
net=10.213.$(( $$ % 250 ))
dir=$(mktemp -d)
cleanup() {
  ip link del ${t}br 2>/dev/null
  for i in 1 2; do ip netns del ${t}n$i 2>/dev/null; ip link del ${t}v$i 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
if ! ip netns add ${t}n1 2>/dev/null; then echo "SKIP: cannot create network namespaces here"; exit 77; fi
# What the machine may not allow (no bridge or veth support): skipped, not failed.
skip() { echo "SKIP: $*"; exit 77; }
ip netns add ${t}n2 || skip "cannot create a second namespace"
ip link add ${t}br type bridge && ip addr add $net.1/24 dev ${t}br && ip link set ${t}br up ||
  skip "no bridge devices here"
for i in 1 2; do
  ip link add ${t}v$i type veth peer name ${t}p$i && ip link set ${t}p$i netns ${t}n$i &&
    ip link set ${t}v$i master ${t}br up && ip -n ${t}n$i addr add $net.$((i + 1))/24 dev ${t}p$i &&
    ip -n ${t}n$i link set ${t}p$i up && ip -n ${t}n$i link set lo up || skip "no veth devices here"
done
cat > "$dir/agent.sh" <<AGENT
#!/bin/sh
# Open MPI's rsh agent: [options] HOST COMMAND...: COMMAND in HOST's namespace.
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
case \$host in $net.2) ns=${t}n1 ;; $net.3) ns=${t}n2 ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec \$ns /bin/sh -c "\$*"
AGENT
chmod +x "$dir/agent.sh"
printf "%s slots=1\n%s slots=1\n" $net.2 $net.3 > "$dir/hosts"
# TCP only, on the namespaces' network; keepalive probes so that mpirun
# notices a host whose link is gone in seconds, not TCP's minutes.
MPI="$MPIRUN --allow-run-as-root --oversubscribe --hostfile $dir/hosts --mca plm_rsh_agent $dir/agent.sh
  --mca oob_tcp_if_include $net.0/24 --mca btl self,tcp --mca btl_tcp_if_include $net.0/24
  --mca mpi_yield_when_idle 1 --mca oob_tcp_keepalive_time 3 --mca oob_tcp_keepalive_intvl 1
  --mca oob_tcp_keepalive_probes 3 --mca rtc ^hwloc -x OMP_NUM_THREADS=1"
cat > "$dir/run.json" <<'JSON'
{"model": {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 16, "vocab_size": 256},
 "data": {"dataset": "fortunes"},
 "train": {"steps": 4, "batch_size": 8, "seq_len": 16, "threads": 1, "log_every": 1, "eval_batches": 2},
 "optimizer": {"type": "adamw", "lr": 1e-3}}
JSON
losses() { grep -v '"eval"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
case $MODE in
  equal)
    "$BIN" train "$dir/run.json" --ranks 2 --quiet --metrics "$dir/local.jsonl" \
      --checkpoint "$dir/local.safetensors" || fail "local run failed"
    timeout 120 $MPI -np 2 "$BIN" train "$dir/run.json" --quiet --metrics "$dir/hosts.jsonl" \
      --checkpoint "$dir/hosts.safetensors" || fail "the 2-namespace mpirun failed"
    losses "$dir/local.jsonl" > "$dir/l.txt"; losses "$dir/hosts.jsonl" > "$dir/h.txt"
    [ "$(wc -l < "$dir/l.txt")" -eq 4 ] || fail "expected 4 step records: $(cat "$dir/h.txt")"
    diff "$dir/l.txt" "$dir/h.txt" || fail "losses differ between --ranks 2 and two hosts"
    cmp "$dir/local.safetensors" "$dir/hosts.safetensors" || fail "weights differ"
    echo "two namespaces over TCP: identical losses $(tr '\n' ' ' < "$dir/h.txt")and weights" ;;
  cut)
    start=$(date +%s)
    MESHFLOW_COMM_TIMEOUT_S=2 timeout 90 $MPI -np 2 -x MESHFLOW_COMM_TIMEOUT_S "$BIN" train \
      "$dir/run.json" --quiet --steps 1000000 > "$dir/out.txt" 2>&1 &
    job=$!
    sleep 3
    ip link set ${t}v2 down  # host 2's cable
    wait $job; rc=$?
    el=$(( $(date +%s) - start ))
    # The rank on the cut-off host ends on its own (its peer timed out, its
    # daemon lost mpirun): every process of the job gone within 30 s.
    left=1
    while [ $(( $(date +%s) - start )) -lt 33 ]; do
      left=$(pgrep -fc -- "$dir/run.json"); [ "$left" -eq 0 ] && break; sleep 1
    done
    gone=$(( $(date +%s) - start ))
    grep -v '^\[' "$dir/out.txt" | head -12
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "exit code $rc (124: hung until the timeout)"
    [ $el -lt 33 ] || fail "took ${el}s after the start (the cut was at 3 s)"
    [ "$left" -eq 0 ] || fail "$left processes of the job still run ${gone}s after the start"
    grep -q "rank 1" "$dir/out.txt" || fail "the output does not name rank 1"
    echo "link cut at 3 s: mpirun ended at ${el}s (exit $rc), every rank by ${gone}s, naming rank 1" ;;
  *) fail "unknown mode $MODE" ;;
esac
echo "PASS $MODE"
