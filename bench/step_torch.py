"""The PyTorch side of bench/step.py: the same models under DDP, and joining a Gloo group.

Imported by bench/step.py only; torch is imported inside the functions (the
`bench` extra), so step.py runs without it.
"""

import json
import os
import time

import step_models  # bench/, on the path of bench/step.py
from _relaunch import host_device


def build(torch, name):
    """The PyTorch twin of step_models.keras_model(keras, `name`)."""
    nn = torch.nn
    if name in ("resnet20", "transformer", "gru"):
        return {"resnet20": _resnet20, "transformer": _transformer, "gru": _gru}[name](torch)
    if name == "mlp":
        return nn.Sequential(nn.Linear(40, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 10))
    return nn.Sequential(nn.Unflatten(1, (1, 40)),
                         nn.Conv1d(1, 32, 5, padding=2), nn.ReLU(),
                         nn.Conv1d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv1d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(320, 64), nn.ReLU(), nn.Linear(64, 10))


def _resnet20(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                           nn.BatchNorm2d(cout)) if stride != 1 else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.shortcut(x))

    blocks, cin = [], 16
    for stage, cout in enumerate((16, 32, 64)):
        for block in range(3):
            blocks.append(Block(cin, cout, 2 if stage > 0 and block == 0 else 1))
            cin = cout
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def _transformer(torch):
    nn = torch.nn
    vocab, seq, width = step_models.VOCAB, step_models.SEQ, step_models.WIDTH

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.token, self.position = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            layer = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0,
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(width, 2)

        def forward(self, ids):
            x = self.token(ids) + self.position(torch.arange(ids.shape[1]))
            return self.head(self.encoder(x).mean(1))

    return Transformer()


def _gru(torch):
    nn = torch.nn

    class Gru(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru, self.head = nn.GRU(32, 128, batch_first=True), nn.Linear(128, 10)

        def forward(self, x):
            return self.head(self.gru(x)[1][-1])

    return Gru()


def runner(name, args, rank):
    """`run(skip, steps)` -> seconds: DDP training steps of model `name` (group joined)."""
    import torch  # pylint: disable=import-outside-toplevel

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build(torch, name))
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = step_models.data(name, seed=rank)
    if x.ndim == 4:  # images: PyTorch takes channels first
        x = x.transpose(0, 3, 1, 2).copy()
    x = torch.tensor(x, dtype=torch.long if x.dtype.kind == "i" else torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    batch = args.batch or step_models.BATCH[name]
    position = [0]

    def run(skip, steps):
        for step in range(skip + steps):
            if step == skip:
                start_time = time.perf_counter()
            start = position[0] % (len(x) - batch)
            position[0] += batch
            optimizer.zero_grad()
            loss = loss_fn(model(x[start:start + batch]), y[start:start + batch])
            loss.backward()
            optimizer.step()
        loss.item()
        return time.perf_counter() - start_time

    run(0, args.warmup)
    return run


def worker(args, measure):
    """PyTorch DDP (Gloo) under torchrun, or under tfdist-run -H (one namespace per
    host): `(rank, world, {model: [measure(run, args) per repeat]})`."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel

    if "TF_CONFIG" in os.environ:
        config = json.loads(os.environ["TF_CONFIG"])
        chief = config["cluster"]["worker"][0].rsplit(":", 1)[0]
        os.environ.setdefault("GLOO_SOCKET_IFNAME", host_device())
        dist.init_process_group("gloo", init_method=f"tcp://{chief}:{args.port}",
                                rank=config["task"]["index"],
                                world_size=len(config["cluster"]["worker"]))
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for name in args.models.split(","):
        run = runner(name, args, rank)
        results[name] = [measure(run, args) for _ in range(args.repeats)]
    # Gloo's pairs torn down while a peer still uses them can abort a process
    # ("terminate called without an active exception", about 1 launch in 10).
    dist.barrier()
    dist.destroy_process_group()
    return rank, world, results


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
