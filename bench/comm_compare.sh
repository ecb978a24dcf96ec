#!/usr/bin/env bash
# Bus bandwidth (nccl-tests definition) of meshflow's collectives on both
# backends, side by side with raw MPI and PyTorch gloo, on this machine:
#   local      meshflow Communicator, ranks are threads (bench/comm_bench.cc)
#   mpi        meshflow Communicator over the mpi transport (bench/mpi_comm_bench.cc)
#   raw MPI    MPI_Allreduce / MPI_Allgather / MPI_Reduce_scatter_block (bench/mpi_allreduce_raw.cc)
#   gloo       torch.distributed all_reduce, gloo backend over loopback TCP (bench/gloo_allreduce.py)
# f32 sum, 1 KiB .. 256 MiB, SIZE = the whole buffer (all_reduce buffer,
# all_gather output, reduce_scatter input); busbw = algbw x 2(n-1)/n for
# all_reduce, x (n-1)/n for all_gather and reduce_scatter. GB/s = 1e9 B/s.
# All four measure the same way (bench/comm_bench.cc): one warm-up call picks
# the iteration count (about SECONDS_PER_SIZE), the slowest rank's mean time.
#   bash bench/comm_compare.sh    (BUILD=build RANKS="2 4" MAX_BYTES=268435456 SECONDS_PER_SIZE=0.25)
# Needs openmpi-bin and python3-torch (scripts/install-deps.sh). On a 2-core
# machine 4 ranks are oversubscribed: compare columns, not absolute figures.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BENCH_DIR=${BENCH_DIR:-$BUILD/bench}
RANKS=${RANKS:-"2 4"}
MIN_BYTES=${MIN_BYTES:-1024}
MAX_BYTES=${MAX_BYTES:-268435456}
SECONDS_PER_SIZE=${SECONDS_PER_SIZE:-0.25}
OUT_DIR=${OUT_DIR:-}  # when set, the four programs' own tables are kept there
cmake --build "$BUILD" --target comm_bench mpi_comm_bench mpi_allreduce_raw -j2 >/dev/null
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "PyTorch missing: run scripts/install-deps.sh"; exit 2; }
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sizes=(--min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --seconds "$SECONDS_PER_SIZE")
for n in $RANKS; do
  "$BENCH_DIR/comm_bench" --ranks "$n" "${sizes[@]}" >"$tmp/local.$n"
  "${MPIRUN[@]}" -np "$n" "$BENCH_DIR/mpi_comm_bench" "${sizes[@]}" >"$tmp/mpi.$n"
  "${MPIRUN[@]}" -np "$n" "$BENCH_DIR/mpi_allreduce_raw" "${sizes[@]}" >"$tmp/raw.$n"
  /usr/bin/python3 bench/gloo_allreduce.py --ranks "$n" "${sizes[@]}" >"$tmp/gloo.$n" 2>"$tmp/gloo.$n.err" ||
    { cat "$tmp/gloo.$n.err"; exit 1; }
done
if [ -n "$OUT_DIR" ]; then mkdir -p "$OUT_DIR" && cp "$tmp"/* "$OUT_DIR"/; fi
/usr/bin/python3 - "$tmp" $RANKS <<'PY'
import re, sys
tmp, ranks = sys.argv[1], sys.argv[2:]
cols = [("local", "local"), ("mpi", "mpi"), ("raw", "raw MPI"), ("gloo", "gloo")]
head = re.compile(r"^(\w+), .*, (\d+) ranks$")
row = re.compile(r"^\s*(\d+) (KiB|MiB)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)")

def load(path):
    # The comm_bench table format: "OP, BACKEND, N ranks", then rows
    # "SIZE UNIT time_us algbw busbw iters".
    table, op = {}, None
    for line in open(path):
        if m := head.match(line.strip()):
            op = m.group(1)
        elif (m := row.match(line)) and op:
            size = int(m.group(1)) << (20 if m.group(2) == "MiB" else 10)
            table[(op, size)] = (float(m.group(3)), float(m.group(5)))
    return table

def size_str(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

print("bus bandwidth in GB/s (time per call in us); busbw = algbw x 2(n-1)/n (all_reduce),"
      " x (n-1)/n (all_gather, reduce_scatter)")
for n in ranks:
    data = {key: load(f"{tmp}/{key}.{n}") for key, _ in cols}
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        sizes = sorted({s for t in data.values() for (o, s) in t if o == op})
        if not sizes:
            continue
        print(f"\n== {op}, {n} ranks")
        print(f"{'size':>8}" + "".join(f"{name:>21}" for _, name in cols))
        for s in sizes:
            line = f"{size_str(s):>8}"
            for key, _ in cols:
                hit = data[key].get((op, s))
                line += f"{hit[1]:>9.2f} ({hit[0]:>9.1f})" if hit else f"{'-':>21}"
            print(line)
PY
