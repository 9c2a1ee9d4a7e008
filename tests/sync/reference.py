"""Numpy implementations of the sync policies' update rules, written from the papers.

All on the least-squares loss of a bias-free linear model: replica i's loss on
rows X_i is mean((X_i w - y_i)^2), gradient 2 X_i^T (X_i w - y_i) / |X_i|.
`rows(t, i)` gives the rows replica i trains on at step t.
"""

import numpy as np


def gradient(w, x, y):
    return 2.0 * x.T @ (x @ w - y) / len(x)


def synchronous(w0, rows, steps, num, lr):
    w = w0.copy()
    for t in range(steps):
        w = w - lr * np.mean([gradient(w, *rows(t, i)) for i in range(num)], axis=0)
    return [w.copy() for _ in range(num)]


def local_sgd(w0, rows, steps, num, lr, period, warmup=0):
    """Per-replica weights after each step (list over steps of lists over replicas)."""
    ws = [w0.copy() for _ in range(num)]
    history = []
    for t in range(steps):
        grads = [gradient(ws[i], *rows(t, i)) for i in range(num)]
        if t < warmup:
            mean = np.mean(grads, axis=0)
            ws = [w - lr * mean for w in ws]
        else:
            ws = [w - lr * g for w, g in zip(ws, grads)]
            if (t + 1) % period == 0:
                avg = np.mean(ws, axis=0)
                ws = [avg.copy() for _ in range(num)]
        history.append([w.copy() for w in ws])
    return history


def delayed_averaging(w0, rows, steps, num, lr, delay):
    """Zhu et al. 2021: w_i -= lr (g_i(t) - g_i(t-D) + mean_j g_j(t-D)); then the drain.

    Returns (history of per-replica weights, drained weights).
    """
    ws = [w0.copy() for _ in range(num)]
    grads, history = [], []
    for t in range(steps):
        grads.append([gradient(ws[i], *rows(t, i)) for i in range(num)])
        for i in range(num):
            step = grads[t][i]
            if t >= delay:
                old = grads[t - delay]
                step = step - old[i] + np.mean(old, axis=0)
            ws[i] = ws[i] - lr * step
        history.append([w.copy() for w in ws])
    for t in range(max(0, steps - delay), steps):  # drain: own -> average
        for i in range(num):
            ws[i] = ws[i] + lr * (grads[t][i] - np.mean(grads[t], axis=0))
    return history, np.mean(ws, axis=0)


def delayed_averaging_compressed(w0, rows, steps, num, lr, delay, send, total=None):
    """Delayed averaging whose rounds carry compressed contributions.

    In Keras' scaling each replica contributes k_i = g_i / num; it sends
    c_i = send(k_i, r_i) (with error feedback r_i), and applies
    g_i(t) - num c_i(t - D) + sum_j c_j(t - D). `send(vector, residual) ->
    (sent, residual)`; `total(list of sent) -> their sum` as the wire adds them
    (default: exact).
    """
    total = total or (lambda vectors: np.sum(vectors, axis=0))
    ws = [w0.copy() for _ in range(num)]
    residuals = [np.zeros_like(w0) for _ in range(num)]
    sent, history = [], []
    for t in range(steps):
        grads = [gradient(ws[i], *rows(t, i)) for i in range(num)]
        mine = []
        for i in range(num):
            c, residuals[i] = send(grads[i] / num, residuals[i])
            mine.append(c)
        sent.append(mine)
        for i in range(num):
            step = grads[i]
            if t >= delay:
                old = sent[t - delay]
                step = step - num * old[i] + total(old)
            ws[i] = ws[i] - lr * step
        history.append([w.copy() for w in ws])
    for t in range(max(0, steps - delay), steps):  # drain
        for i in range(num):
            ws[i] = ws[i] - lr * (total(sent[t]) - num * sent[t][i])
    return history, np.mean(ws, axis=0)


def stale_synchronous(w0, rows, steps, num, lr, staleness, momentum=0.0):
    """SSP: own gradient at once, the others' of step t at step t + s (1/N each), applied
    with SGD of `momentum` (Keras' form: v = m v - lr u, w += v); the drain is plain SGD."""
    ws = [w0.copy() for _ in range(num)]
    velocities = [np.zeros_like(w0) for _ in range(num)]
    grads, history = [], []
    for t in range(steps):
        grads.append([gradient(ws[i], *rows(t, i)) for i in range(num)])
        for i in range(num):
            update = grads[t][i]
            if t >= staleness:
                old = grads[t - staleness]
                update = update + sum(old[j] for j in range(num) if j != i)
            velocities[i] = momentum * velocities[i] - lr / num * update
            ws[i] = ws[i] + velocities[i]
        history.append([w.copy() for w in ws])
    for t in range(max(0, steps - staleness), steps):
        for i in range(num):
            ws[i] = ws[i] - lr / num * sum(grads[t][j] for j in range(num) if j != i)
    return history, np.mean(ws, axis=0)


def model_averaging(w0, rows, steps, num, lr, learners, alpha, momentum):
    """Crossbow SMA (Koliousis et al. 2019, section 3); returns z after each step."""
    z, z_prev = w0.copy(), w0.copy()
    ws = [[w0.copy() for _ in range(learners)] for _ in range(num)]
    history = []
    for t in range(steps):
        total = np.zeros_like(z)
        for i in range(num):
            x, y = rows(t, i)
            b = len(x)
            for j in range(learners):
                lo, hi = j * b // learners, (j + 1) * b // learners
                c = alpha * (ws[i][j] - z)
                ws[i][j] = ws[i][j] - lr * gradient(ws[i][j], x[lo:hi], y[lo:hi]) - c
                total += c
        z, z_prev = z + total + momentum * (z - z_prev), z
        history.append(z.copy())
    return history


def top_k_feedback(k):
    """Top-k by magnitude with error feedback: fn(vector, residual) -> (sent, residual)."""

    def compress(vector, residual):
        corrected = vector + residual
        sent = np.zeros_like(corrected)
        keep = np.argsort(-np.abs(corrected.ravel()), kind="stable")[:k]
        sent.ravel()[keep] = corrected.ravel()[keep]
        return sent, corrected - sent

    return compress


def exact(vector, residual):
    """The identity "compressor" for `local_sgd_compressed`."""
    return vector + residual, np.zeros_like(residual)


def outer_step(kind, lr, momentum):
    """DiLoCo's outer optimizer: fn(mean change D, velocity) -> (step, velocity)."""

    def step(change, velocity):
        if kind == "none":
            return lr * change, velocity
        velocity = momentum * velocity + change
        return lr * (velocity if kind == "sgd" else change + momentum * velocity), velocity

    return step


def local_sgd_compressed(w0, rows, steps, num, lr, period, compress, warmup=0,
                         drain_every=None, outer=None):
    """Local SGD sending compressed parameter changes since the last average.

    Warm-up steps all-reduce compressed gradients (own residuals) and move the
    anchor along; each round: d_i = a - w_i, w = a - mean_i C(d_i), a = w.
    Every `drain_every` steps (an epoch's end) the weights are averaged
    exactly and the anchor moves there. `outer` (from `outer_step`) replaces
    a -= D by an outer optimizer's step.
    """
    outer = outer or outer_step("none", 1.0, 0.0)
    velocity = np.zeros_like(w0)
    ws = [w0.copy() for _ in range(num)]
    anchor = w0.copy()
    grad_residuals = [np.zeros_like(w0) for _ in range(num)]
    delta_residuals = [np.zeros_like(w0) for _ in range(num)]
    history = []
    for t in range(steps):
        grads = [gradient(ws[i], *rows(t, i)) for i in range(num)]
        if t < warmup:
            sent = []
            for i in range(num):
                s, grad_residuals[i] = compress(grads[i], grad_residuals[i])
                sent.append(s)
            ws = [w - lr * np.mean(sent, axis=0) for w in ws]
            anchor = ws[0].copy()
        else:
            ws = [w - lr * g for w, g in zip(ws, grads)]
            if (t + 1) % period == 0:
                sent = []
                for i in range(num):
                    s, delta_residuals[i] = compress(anchor - ws[i], delta_residuals[i])
                    sent.append(s)
                step, velocity = outer(np.mean(sent, axis=0), velocity)
                anchor = anchor - step
                ws = [anchor.copy() for _ in range(num)]
        history.append([w.copy() for w in ws])
        if drain_every and (t + 1) % drain_every == 0:
            anchor = np.mean(ws, axis=0)
            ws = [anchor.copy() for _ in range(num)]
    return history


def gossip(w0, rows, steps, num, lr, table, mixing, momentum=0.0, mix_slots=False,
           mix_gradients=False):
    """D-PSGD: own (momentum) SGD step, then w_r = (1 - p m) w_r + m sum_j w_{(r - s_j(t)) mod N};
    with `mix_slots` the momentum buffers are mixed alike, with `mix_gradients` the
    gradients before the step."""
    ws = [w0.copy() for _ in range(num)]
    velocities = [np.zeros_like(w0) for _ in range(num)]
    history = []

    def mix(values, shifts):
        return [(1 - len(shifts) * mixing) * values[r]
                + mixing * sum(values[(r - s) % num] for s in shifts) for r in range(num)]

    for t in range(steps):
        shifts = table[t % len(table)]
        grads = [gradient(w, *rows(t, i)) for i, w in enumerate(ws)]
        if mix_gradients:
            grads = mix(grads, shifts)
        velocities = [momentum * v - lr * g for v, g in zip(velocities, grads)]
        ws = [w + v for w, v in zip(ws, velocities)]
        ws = mix(ws, shifts)
        if mix_slots:
            velocities = mix(velocities, shifts)
        history.append([w.copy() for w in ws])
    return history
