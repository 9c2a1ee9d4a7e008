"""The PyTorch twin of bench/zero.py: DDP with Adam or `ZeroRedundancyOptimizer(Adam)`.

    python -m torch.distributed.run --nproc-per-node=N bench/zero_torch.py \
        --zero 1 --out PREFIX --input 4096 --hidden 4096 --layers 3 --batch 16 ...

Run by bench/zero.py with `--torch PYTHON`; writes PREFIX-w<rank>.json with the
same fields as bench/zero.py's workers. Needs only torch and numpy (Gloo).
"""

import argparse
import json
import resource
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer


def main():
    parser = argparse.ArgumentParser()
    for key in ("zero", "input", "hidden", "layers", "batch", "steps", "warmup"):
        parser.add_argument(f"--{key}", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    layers, width = [], args.input
    for _ in range(args.layers):
        layers += [torch.nn.Linear(width, args.hidden), torch.nn.ReLU()]
        width = args.hidden
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)))
    if args.zero:
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                            lr=1e-4)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(rank)
    x = torch.tensor(rng.normal(size=(args.batch, args.input)).astype("float32"))
    y = torch.tensor(rng.integers(0, 10, size=args.batch))
    times = []
    for _ in range(args.warmup + args.steps):
        times.append(time.perf_counter())
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    times.append(time.perf_counter())
    local = optimizer.optim if args.zero else optimizer
    state = sum(t.numel() * t.element_size() for s in local.state.values()
                for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    record = {"state_bytes": state,
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "median_step_s": float(np.median(np.diff(times)[args.warmup:])),
              "loss": float(loss), "weights": sum(p.numel() for p in model.parameters())}
    with open(f"{args.out}-w{rank}.json", "w", encoding="utf-8") as f:
        json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
