"""TF_CONFIG derived from a Slurm job step, so `srun -n N python train.py` just works.

`srun` starts one process per task and tells each, in its environment, its
rank (``SLURM_PROCID``), the step's size (``SLURM_STEP_NUM_TASKS``), nodes
(``SLURM_STEP_NODELIST``, a compressed host list such as ``gpu[01-03,07]``),
tasks per node (``SLURM_STEP_TASKS_PER_NODE``, such as ``2(x3),1``) and how
tasks were laid out on the nodes (``SLURM_DISTRIBUTION``, set when the user
passed ``--distribution``; Slurm's default is ``block``). From these every
task can compute every other task's node, and each task listens on a port
of its own: ``base + local index``. The base is ``TFDIST_PORT`` when set,
else derived from the job and step ids (10000-29999, below Linux's ephemeral
range), so two steps running at once on a node do not collide.

Only a job step with more than one task is a cluster: ``sbatch``'s batch
script and ``salloc``'s shell carry ``SLURM_NTASKS`` but no step variables
and stay single-process, as does ``srun -n 1``. ``TFDIST_SLURM=0`` turns the
derivation off (e.g. for ``srun -n 4`` running four independent trainings).
`tfdist_ext.cluster_env.apply` (called by `import tfdist_ext`) sets TF_CONFIG
from it when TF_CONFIG is not set.

Tuning: set ``TFDIST_PORT`` if the derived ports are taken on your nodes.
"""

import json
import re
from typing import List, Mapping, Optional

OPT_OUT = "TFDIST_SLURM"
PORT = "TFDIST_PORT"
TASKS, RANK, NODES = "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_STEP_NODELIST"
TASKS_PER_NODE, DISTRIBUTION = "SLURM_STEP_TASKS_PER_NODE", "SLURM_DISTRIBUTION"
FIRST_PORT, PORT_SLOTS, MAX_TASKS_PER_NODE = 10000, 1000, 20
_ADVICE = "Run the script with `srun -n N python train.py` in a job (sbatch or salloc)."


def _error(name, value, problem, fix=_ADVICE):
    return ValueError(f"Slurm environment variable {name}={value!r} {problem}. {fix} "
                      f"Set {OPT_OUT}=0 to ignore Slurm's environment.")


def expand_hostlist(text: str) -> List[str]:
    """Slurm's compressed host list as names: "n[1-3,07],gpu2" -> n1 n2 n3 n07 gpu2.

    Ranges keep the width of their first bound ("n[08-10]" -> n08 n09 n10);
    several bracketed parts in one name expand as a product.

    Raises:
        ValueError: malformed list (unbalanced brackets, a bad range).
    """
    names: List[str] = []
    for item in _split_top_level(text):
        names.extend(_expand_name(item, text))
    return names


def _split_top_level(text):
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise _error(NODES, text, "has unbalanced brackets")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise _error(NODES, text, "has unbalanced brackets")
    items.append(text[start:])
    if any(not item for item in items):
        raise _error(NODES, text, "has an empty host name")
    return items


def _expand_name(item, text):
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", item)
    if match is None:
        return [item]
    prefix, ranges, rest = match.groups()
    tails = _expand_name(rest, text) if rest else [""]
    heads = []
    for part in ranges.split(","):
        bounds = part.split("-")
        if len(bounds) > 2 or not all(b.isdigit() for b in bounds):
            raise _error(NODES, text, f"has a bad range {part!r}")
        low, high = int(bounds[0]), int(bounds[-1])
        if high < low:
            raise _error(NODES, text, f"has a decreasing range {part!r}")
        heads.extend(f"{prefix}{n:0{len(bounds[0])}d}" for n in range(low, high + 1))
    return [head + tail for head in heads for tail in tails]


def expand_tasks_per_node(text: str) -> List[int]:
    """Slurm's tasks-per-node list as counts: "2(x3),1" -> [2, 2, 2, 1].

    Raises:
        ValueError: malformed list.
    """
    counts: List[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise _error(TASKS_PER_NODE, text, "is not a list like 2(x3),1")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def layout(tasks_per_node: List[int], distribution: str) -> List[int]:
    """The node index of every rank, for Slurm's node-level task distribution.

    "block" fills each node before the next; "cyclic" deals one task to each
    node in turn; "plane=P" deals P at a time. Nodes that are full are skipped.

    Raises:
        ValueError: a distribution that does not fix the layout ("arbitrary").
    """
    kind = (distribution or "block").split(":")[0].split(",")[0]
    if kind == "block":
        plane = max(tasks_per_node, default=1)
    elif kind == "cyclic":
        plane = 1
    elif kind.startswith("plane="):
        plane = int(kind[len("plane="):]) if kind[len("plane="):].isdigit() else 0
        if plane < 1:
            raise _error(DISTRIBUTION, distribution, "has no plane size")
    else:
        raise _error(DISTRIBUTION, distribution,
                     "does not say on which node each task runs",
                     "Use --distribution=block (the default), cyclic or plane=N, or write "
                     "TF_CONFIG yourself.")
    left, nodes = list(tasks_per_node), []
    while any(left):
        for node, count in enumerate(left):
            take = min(plane, count)
            nodes.extend([node] * take)
            left[node] -= take
    return nodes


def _integer(env, name, low, high):
    text = env.get(name, "")
    if not text.isdigit() or not low <= int(text) <= high:
        raise _error(name, text, f"is not an integer in [{low}, {high}]")
    return int(text)


def slurm_tf_config(env: Mapping[str, str]) -> Optional[str]:
    """The TF_CONFIG of this task of a Slurm job step, or None when `env` is not one.

    Args:
        env: The process environment (the ``SLURM_*`` variables `srun` sets,
            optionally ``TFDIST_PORT`` and ``TFDIST_SLURM``).

    Raises:
        ValueError: a step variable is malformed or disagrees with the others,
            or this task is not where the layout puts it; the message names
            the variable, the value and the fix.
    """
    if env.get(OPT_OUT) == "0" or TASKS not in env or RANK not in env:
        return None
    tasks = _integer(env, TASKS, 1, 1_000_000)
    if tasks < 2:
        return None
    rank = _integer(env, RANK, 0, tasks - 1)
    nodes = expand_hostlist(env.get(NODES, ""))
    per_node = expand_tasks_per_node(env.get(TASKS_PER_NODE, ""))
    if len(per_node) != len(nodes) or sum(per_node) != tasks:
        raise _error(TASKS_PER_NODE, env.get(TASKS_PER_NODE),
                     f"does not match {NODES}={env.get(NODES)!r} ({len(nodes)} nodes) and "
                     f"{TASKS}={tasks}")
    node_of = layout(per_node, env.get(DISTRIBUTION, ""))
    local_of, seen = [], [0] * len(nodes)
    for node in node_of:
        local_of.append(seen[node])
        seen[node] += 1
    for name, want in (("SLURMD_NODENAME", nodes[node_of[rank]]),
                       ("SLURM_LOCALID", local_of[rank])):
        if name in env and env[name] != str(want):
            raise _error(name, env[name],
                         f"is not where the {env.get(DISTRIBUTION) or 'block'} distribution "
                         f"puts task {rank} ({name} {want})",
                         "Use --distribution=block, cyclic or plane=N, or write TF_CONFIG "
                         "yourself.")
    most = max(per_node)
    if env.get(PORT):
        base = _integer(env, PORT, 1, 65536 - most)
    else:
        if most > MAX_TASKS_PER_NODE:
            raise _error(TASKS_PER_NODE, env[TASKS_PER_NODE],
                         f"has more than {MAX_TASKS_PER_NODE} tasks on a node",
                         f"Set {PORT} to the first of {most} free ports on every node.")
        job, step = env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0")
        slot = ((int(job) if job.isdigit() else 0) * 16
                + (int(step) if step.isdigit() else 0)) % PORT_SLOTS
        base = FIRST_PORT + slot * MAX_TASKS_PER_NODE
    addresses = [f"{nodes[n]}:{base + local}" for n, local in zip(node_of, local_of)]
    return json.dumps({"cluster": {"worker": addresses},
                       "task": {"type": "worker", "index": rank}})
