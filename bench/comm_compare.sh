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
#   bash bench/comm_compare.sh          (BUILD=build RANKS="2 4" MAX_BYTES=268435456)
# Needs openmpi-bin and python3-torch (scripts/install-deps.sh). On a 2-core
# machine 4 ranks are oversubscribed: compare columns, not absolute figures.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BENCH_DIR=${BENCH_DIR:-$BUILD/bench}
RANKS=${RANKS:-"2 4"}
MIN_BYTES=${MIN_BYTES:-1024}
MAX_BYTES=${MAX_BYTES:-268435456}
cmake --build "$BUILD" --target comm_bench mpi_comm_bench mpi_allreduce_raw -j2 >/dev/null
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "PyTorch missing: run scripts/install-deps.sh"; exit 2; }
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sizes=(--min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES")
for n in $RANKS; do
  "$BENCH_DIR/comm_bench" --ranks "$n" "${sizes[@]}" >"$tmp/local.$n"
  "${MPIRUN[@]}" -np "$n" "$BENCH_DIR/mpi_comm_bench" "${sizes[@]}" >"$tmp/mpi.$n"
  "${MPIRUN[@]}" -np "$n" "$BENCH_DIR/mpi_allreduce_raw" "${sizes[@]}" >"$tmp/raw.$n"
  /usr/bin/python3 bench/gloo_allreduce.py --ranks "$n" "${sizes[@]}" >"$tmp/gloo.$n" 2>"$tmp/gloo.$n.err" ||
    { cat "$tmp/gloo.$n.err"; exit 1; }
done
/usr/bin/python3 - "$tmp" $RANKS <<'PY'
import sys
tmp, ranks = sys.argv[1], sys.argv[2:]
cols = [("local", "local"), ("mpi", "mpi"), ("raw", "raw MPI"), ("gloo", "gloo")]

def load(path):
    # Lines `OP SIZE_BYTES TIME_US ALGBW BUSBW`; '#' lines are comments.
    table = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and not line.startswith("#"):
            table[(f[0], int(f[1]))] = (float(f[2]), float(f[4]))
    return table

def size_str(b):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b} B"

print("bus bandwidth, GB/s (time per call, us)")
for n in ranks:
    data = {key: load(f"{tmp}/{key}.{n}") for key, _ in cols}
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        keys = sorted({s for t in data.values() for (o, s) in t if o == op})
        if not keys:
            continue
        print(f"\n== {op}, {n} ranks")
        print(f"{'size':>10}" + "".join(f"{name:>22}" for _, name in cols))
        for s in keys:
            row = f"{size_str(s):>10}"
            for key, _ in cols:
                # all_gather / reduce_scatter sizes are rounded down to whole floats per rank.
                hit = data[key].get((op, s)) or next(
                    (v for (o, ss), v in data[key].items() if o == op and abs(ss - s) < 4 * int(n)), None)
                row += f"{hit[1]:>11.2f} ({hit[0]:>8.1f})" if hit else f"{'-':>22}"
            print(row)
PY
