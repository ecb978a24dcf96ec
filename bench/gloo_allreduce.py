#!/usr/bin/python3
"""PyTorch gloo all_reduce bus bandwidth on this machine, the reference point for
meshflow's local and mpi backends (bench/comm_compare.sh prints them side by side).

    /usr/bin/python3 bench/gloo_allreduce.py --ranks 4 [--min-bytes 1024] [--max-bytes 268435456]

Runs N processes on localhost (TCP loopback, gloo's only transport here), f32 sum
all_reduce of 1 KiB .. 256 MiB in steps of 4x. Bus bandwidth as in nccl-tests:
algbw = bytes / time, busbw = algbw * 2(n-1)/n. The time of a size is the slowest
rank's mean over the timed iterations. Needs Debian's python3-torch, hence
/usr/bin/python3 (the `python3` first on PATH may be another interpreter).
Output: one line per size, `all_reduce BYTES TIME_US ALGBW_GBPS BUSBW_GBPS`.
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def iterations(nbytes):
    # Enough iterations for a stable mean, at most about 0.5 GiB moved per size.
    return max(3, min(200, (512 << 20) // nbytes))


def worker(rank, world, port, sizes):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    for nbytes in sizes:
        x = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
        for _ in range(max(1, iterations(nbytes) // 10)):
            dist.all_reduce(x)  # warm-up (connection setup, buffer allocation)
        expect = world * (world + 1) / 2  # sum over ranks of (rank + 1)
        x.fill_(float(rank + 1))
        dist.all_reduce(x)
        if abs(float(x[0]) - expect) > 1e-3:
            raise RuntimeError(f"rank {rank}: all_reduce gave {float(x[0])}, expected {expect}")
        iters = iterations(nbytes)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if rank == 0:
            t = elapsed.item() / iters
            algbw = nbytes / t / 1e9
            busbw = algbw * 2 * (world - 1) / world
            print(f"all_reduce {nbytes} {t * 1e6:.2f} {algbw:.3f} {busbw:.3f}", flush=True)
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
    args = ap.parse_args()
    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 4
    print(f"# gloo all_reduce (torch {torch.__version__}), {args.ranks} ranks, f32 sum; "
          "busbw = algbw * 2(n-1)/n")
    print("# op size_bytes time_us algbw_GBps busbw_GBps", flush=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(args.ranks, free_port(), sizes), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
