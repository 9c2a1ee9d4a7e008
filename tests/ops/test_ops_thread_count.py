"""The compression ops give identical payloads for any intra-op thread count."""

import os
import pathlib
import subprocess
import sys


def test_outputs_do_not_depend_on_the_thread_count():
    """Every worker must get identical payloads for the same seed, whatever its threads."""
    script = (
        "import sys, hashlib, tensorflow as tf\n"
        "tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))\n"
        "from tfdist_ext import ops\n"
        "x = tf.random.stateless_normal([1_000_003], seed=[4, 5])\n"
        "h = hashlib.sha1()\n"
        "for t in [ops.top_k(x, 9000), ops.top_k_approx(x, 9000, seed=2),\n"
        "          ops.random_k(x, 9000, 9), ops.qsgd_encode(x, 15, 3),\n"
        "          ops.qsgd_encode(x, 7, 4, bucket_size=0),\n"
        "          ops.qsgd_encode(x, 7, 5, bucket_size=100_000),\n"
        "          ops.terngrad_encode(x, 3), ops.sign_encode(x), ops.int8_encode(x)]:\n"
        "    for a in t: h.update(a.numpy().tobytes())\n"
        "print('digest', h.hexdigest())\n")
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="2")
    digests = set()
    for threads in (1, 3):
        out = subprocess.run([sys.executable, "-c", script, str(threads)], env=env, cwd=root,
                             capture_output=True, text=True, timeout=120, check=True).stdout
        digests.add(out.split("digest")[-1].strip())
    assert len(digests) == 1, digests
