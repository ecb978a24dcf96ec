#!/usr/bin/python3
"""PyTorch gloo all_reduce bus bandwidth on this machine, the reference point for
meshflow's local and mpi backends (bench/comm_compare.sh prints them side by side).

    /usr/bin/python3 bench/gloo_allreduce.py --ranks 4 [--min-bytes 1024]
        [--max-bytes 268435456] [--seconds 0.25]

Runs N processes on localhost (TCP loopback, gloo's only transport here), f32 sum
all_reduce of 1 KiB .. 256 MiB in steps of 4x, measured and printed as
bench/comm_bench.cc does for meshflow: algbw = size / time, busbw (nccl-tests) =
algbw * 2(n-1)/n; one warm-up call picks the iteration count (about --seconds
per size, 2..5000, the same on every rank); the time is the slowest rank's mean.
Needs Debian's python3-torch, hence /usr/bin/python3 (the `python3` first on
PATH may be another interpreter).
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def human(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def worker(rank, world, port, sizes, seconds):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    if rank == 0:
        print(f"\nall_reduce, gloo (torch {torch.__version__}), {world} ranks")
        print(f"{'size':>10} {'time_us':>12} {'algbw_GB/s':>12} {'busbw_GB/s':>12} {'iters':>6}",
              flush=True)
    for nbytes in sizes:
        x = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(x)  # warm-up: connections, buffers
        expect = world * (world + 1) / 2  # sum over ranks of (rank + 1)
        if abs(float(x[0]) - expect) > 1e-3:
            raise RuntimeError(f"rank {rank}: all_reduce gave {float(x[0])}, expected {expect}")
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        warm = slowest(time.perf_counter() - t0)
        iters = int(min(max(seconds / max(warm, 1e-7), 2), 5000))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        t = slowest(time.perf_counter() - t0) / iters
        if rank == 0:
            algbw = nbytes / t / 1e9
            busbw = algbw * 2 * (world - 1) / world
            print(f"{human(nbytes):>10} {t * 1e6:12.1f} {algbw:12.3f} {busbw:12.3f} {iters:6d}",
                  flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=1 << 10)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--seconds", type=float, default=0.25)
    args = ap.parse_args()
    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 4
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(args.ranks, free_port(), sizes, args.seconds), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
