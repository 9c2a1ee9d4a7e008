"""Which parameter server holds which variable (pure functions)."""

from typing import List, Sequence


def shard(sizes: Sequence[int], num_servers: int) -> List[List[int]]:
    """Assigns whole variables to servers, balancing elements (greedy, largest first).

    Args:
        sizes: Element count of each variable, in model order.
        num_servers: Number of parameter servers.

    Returns:
        Per server, the indices of its variables in model order. Ties go to
        the lowest server index, so every worker computes the same layout.

    Raises:
        ValueError: `num_servers` is not positive, or larger than the number
            of variables (a server would hold nothing).
    """
    if num_servers < 1:
        raise ValueError(f"Argument `num_servers` must be >= 1; received {num_servers}.")
    if num_servers > len(sizes):
        raise ValueError(
            f"There are {num_servers} parameter servers but the model has only "
            f"{len(sizes)} trainable variable(s): every server must hold at least one "
            f"whole variable. Use at most {len(sizes)} server(s) (tfdist-run --ps "
            f"{max(1, len(sizes))}), or drop the extra 'ps' tasks from TF_CONFIG.")
    loads = [0] * num_servers
    owners = [0] * len(sizes)
    counts = [0] * num_servers
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        # An empty server first, so each holds at least one variable.
        server = min(range(num_servers), key=lambda s: (counts[s] > 0, loads[s], s))
        owners[index] = server
        loads[server] += sizes[index]
        counts[server] += 1
    return [[i for i in range(len(sizes)) if owners[i] == s] for s in range(num_servers)]
