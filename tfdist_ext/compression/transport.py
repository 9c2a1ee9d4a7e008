"""The payload compressors' reduction hook: compress, communicate, decompress.

    reducible (fp16, bf16, random-k):   payload --all-reduce (the configured algorithm)--> decompress
    others (top-k, QSGD, sign, ...):    payload --bytes--> int32 --one all-gather--> decompress_sum

TF's CPU CollectiveGatherV2 takes only float32/float16/float64/int32/int64, and
payloads mix uint8 codes, int32 indices and float scales, so a non-reducible
payload travels as the concatenation of its tensors' bytes, padded to a
multiple of 4 and bit-cast to int32: one gather per buffer, whatever the
compressor.
"""

import zlib

import tensorflow as tf

from tfdist_ext.compression.base import fold_seed
from tfdist_ext.compression.error_feedback import (compress_with_feedback,
                                                   compress_with_momentum_correction)

_SEED_BASE = 0x7FD15


def _to_bytes(tensor):
    if tensor.dtype == tf.uint8:
        return tensor
    return tf.reshape(tf.bitcast(tensor, tf.uint8), [-1])


def _from_bytes(data, dtype):
    if dtype == tf.uint8:
        return data
    if dtype.size == 1:  # a same-width bitcast keeps the shape: no trailing axis to fold
        return tf.bitcast(data, dtype)
    return tf.bitcast(tf.reshape(data, [-1, dtype.size]), dtype)


def pack(payload):
    """Payload tensors -> one int32 tensor (their bytes, zero-padded to a multiple of 4)."""
    data = tf.concat([_to_bytes(t) for t in payload], 0)
    pad = -data.shape[0] % 4
    if pad:
        data = tf.concat([data, tf.zeros([pad], tf.uint8)], 0)
    return tf.bitcast(tf.reshape(data, [-1, 4]), tf.int32)


def unpack_gathered(gathered, specs, world_size):
    """Inverse of `pack` after an all-gather of `world_size` packed payloads.

    Returns each payload tensor as [world_size * L_j], replica r at [r*L_j:(r+1)*L_j].
    """
    per_replica = tf.reshape(tf.bitcast(gathered, tf.uint8), [world_size, -1])
    fields, offset = [], 0
    for spec in specs:
        width = spec.shape.num_elements() * spec.dtype.size
        raw = tf.reshape(per_replica[:, offset:offset + width], [-1])
        fields.append(_from_bytes(raw, spec.dtype))
        offset += width
    return tuple(fields)


def buffer_seed(compressor, key, step, rank):
    """The seed replica `rank` compresses buffer `key` with at `step`.

    Identical on every replica when the compressor has `shared_seed` (random-k
    indices), independent per rank otherwise (stochastic rounding). crc32, not
    hash(): str hashes differ between processes, seeds must not.
    """
    bucket = zlib.crc32(key.encode()) % (1 << 30)
    return compressor.replica_seed(fold_seed(_SEED_BASE, step, bucket), rank)


def reduce_payload(compressor, bucket, comm, state):
    """`PayloadCompressor.reduce`: the SUM over replicas of `bucket.flat`.

    Error feedback keeps this replica's residual in `state` under the
    bucket's key (and DGC's velocity under `<key>_velocity`); shared-seed
    compressors decompress with the seed every replica compressed with.
    """
    flat, key, replica = bucket.flat, bucket.key, bucket.replica
    n, dtype = flat.shape.num_elements(), flat.dtype
    seed = buffer_seed(compressor, key, bucket.step, comm.rank)
    residual = (state.residual(key, replica, n, dtype)
                if compressor.error_feedback else None)
    velocity = (state.residual(f"{key}_velocity", replica, n, dtype)
                if compressor.momentum else None)
    updates = []
    if velocity is not None:
        payload, new_residual, new_velocity = compress_with_momentum_correction(
            compressor, flat, residual.read_value(), velocity.read_value(), seed)
        updates.append(velocity.assign(new_velocity))
    else:
        payload, new_residual = compress_with_feedback(
            compressor, flat, None if residual is None else residual.read_value(), seed)
    if compressor.reducible:
        summed = tuple(comm.all_reduce(t) for t in payload)
        result = compressor.decompress(summed, n, dtype, seed=seed)
    else:
        specs = compressor.payload_spec(n, dtype)
        gathered = unpack_gathered(comm.all_gather(pack(payload)), specs, comm.world_size)
        result = compressor.decompress_sum(gathered, n, dtype, comm.world_size, seed=seed)
    if residual is not None:
        updates.append(residual.assign(new_residual))
    if not updates:
        return result
    with tf.control_dependencies(updates):
        return tf.identity(result)
