"""PowerSGD in numpy: the reference the strategy's PowerSGD is checked against.

Written from the algorithm in Vogels et al. (2019) as tfdist_ext documents it
(sums over replicas, Gram-Schmidt orthonormalization, warm start, per-replica
error feedback), independently of the TF code.
"""

import numpy as np


def orthonormalize(matrix, epsilon=1e-8):
    columns = []
    for j in range(matrix.shape[1]):
        column = matrix[:, j].copy()
        for previous in columns:
            column = column - np.sum(previous * column) * previous
        columns.append(column / (np.linalg.norm(column) + epsilon))
    return np.stack(columns, axis=1)


def split(flat, shapes):
    sizes = [int(np.prod(s)) for s in shapes]
    return [p.reshape(s) for p, s in zip(np.split(flat, np.cumsum(sizes)[:-1]), shapes)]


def run(buffers, shapes, matrices, q0, rank, error_feedback=True, dtype=np.float32):
    """PowerSGD over several steps.

    Args:
        buffers: buffers[step][replica], each replica's flat gradient buffer.
        shapes: Shapes of the gradients in a buffer, in order.
        matrices: For each gradient, (rows, cols) if compressed, else None.
        q0: The initial Q (flat, the compressed gradients' Q in order).
        rank: r.

    Returns:
        For each step: (summed flat result, Q after the step (flat), list of
        the replicas' residuals after the step).
    """
    world = len(buffers[0])
    compressed = [i for i, m in enumerate(matrices) if m is not None]
    qs = split(np.asarray(q0, dtype), [(matrices[i][1], rank) for i in compressed])
    residuals = [np.zeros_like(buffers[0][0], dtype) for _ in range(world)]
    history = []
    for step_buffers in buffers:
        corrected = [b.astype(dtype) + (residuals[r] if error_feedback else 0)
                     for r, b in enumerate(step_buffers)]
        pieces = [split(c, shapes) for c in corrected]
        ms = [[pieces[r][i].reshape(matrices[i]) for i in compressed] for r in range(world)]
        p_sum = [sum(ms[r][k] @ qs[k] for r in range(world)) for k in range(len(compressed))]
        p_hat = [orthonormalize(p) for p in p_sum]
        q_local = [[ms[r][k].T @ p_hat[k] for k in range(len(compressed))] for r in range(world)]
        q_sum = [sum(q_local[r][k] for r in range(world)) for k in range(len(compressed))]
        summed, sent = [], [[] for _ in range(world)]
        for i in range(len(shapes)):
            if matrices[i] is None:
                summed.append(sum(pieces[r][i] for r in range(world)).ravel())
                for r in range(world):
                    sent[r].append(pieces[r][i].ravel())
            else:
                k = compressed.index(i)
                summed.append((p_hat[k] @ q_sum[k].T).ravel())
                for r in range(world):
                    sent[r].append((p_hat[k] @ q_local[r][k].T).ravel())
        qs = [q if np.all(np.isfinite(q)) and np.any(q != 0) else old
              for q, old in zip(q_sum, qs)]
        if error_feedback:
            residuals = [corrected[r] - np.concatenate(sent[r]) for r in range(world)]
        history.append((np.concatenate(summed), np.concatenate([q.ravel() for q in qs]),
                        [r.copy() for r in residuals]))
    return history
