"""The PyTorch side of bench/step.py: the same models under DDP, and joining a Gloo group.

Imported by bench/step.py only; torch is imported inside the functions (the
`bench` extra), so step.py runs without it.
"""

import time

import numpy as np


def build(torch, name):
    """The PyTorch twin of bench/step.py's Keras model `name` ("mlp" or "cnn")."""
    nn = torch.nn
    if name == "mlp":
        return nn.Sequential(nn.Linear(40, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 10))
    return nn.Sequential(nn.Unflatten(1, (1, 40)),
                         nn.Conv1d(1, 32, 5, padding=2), nn.ReLU(),
                         nn.Conv1d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv1d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(320, 64), nn.ReLU(), nn.Linear(64, 10))


def runner(name, args, rank):
    """`run(skip, steps)` -> seconds: DDP training steps of model `name` (group joined)."""
    import torch  # pylint: disable=import-outside-toplevel

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build(torch, name))
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(rank)
    x = torch.tensor(rng.normal(size=(4096, 40)).astype("float32"))
    y = torch.tensor(rng.integers(0, 10, size=4096))
    position = [0]

    def run(skip, steps):
        for step in range(skip + steps):
            if step == skip:
                start_time = time.perf_counter()
            start = position[0] % (len(x) - args.batch)
            position[0] += args.batch
            optimizer.zero_grad()
            loss = loss_fn(model(x[start:start + args.batch]), y[start:start + args.batch])
            loss.backward()
            optimizer.step()
        loss.item()
        return time.perf_counter() - start_time

    run(0, args.warmup)
    return run


def join(args, rank, world):
    """Joins a Gloo group of the tfdist_ext workers (`--paired-ddp`); False without torch."""
    try:
        import torch  # pylint: disable=import-outside-toplevel
        import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    except ImportError:
        return False
    if world > 1:  # torchrun's rule for co-located workers (OMP_NUM_THREADS=1)
        torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=world)
    return True
