"""Installs tfdist_ext and builds its C++ custom-op library.

The op library is compiled from every ``custom_ops/**/*.cc`` outside
``custom_ops/ucx/`` with exactly the flags `tf.sysconfig` reports (docs/tf_internals.md,
"Custom ops against the wheel"), into ``tfdist_ext/ops/_tfdist_ops.so``, and the
TensorFlow version it was built for is stamped beside it in ``_build_info.json``. The
UCX engine's library (``custom_ops/ucx/`` -> ``_tfdist_ucx.so``, stamp
``_ucx_build_info.json``) is built the same way when the ``libucx-cu12`` wheel is
installed, with its headers and libraries (rpath to the wheel's ``lib/``). A failed
build does not fail the install: ``import tfdist_ext`` keeps working and only the
features that need the ops raise an error that says how to rebuild.

Build in place (for a development checkout):
    python -m pip install --no-build-isolation -e .
    python setup.py build_ext --inplace        # rebuild the ops only
"""

import concurrent.futures
import json
import os
import pathlib
import platform
import subprocess
import sys

from distutils.errors import CCompilerError  # pylint: disable=deprecated-module

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
OPS_PACKAGE_DIR = "tfdist_ext/ops"
BUILD_INFO_NAME = "_build_info.json"
UCX_BUILD_INFO_NAME = "_ucx_build_info.json"
UCX_SOURCES = "ucx"  # subdirectory of custom_ops/ built into the UCX library
EXTRA_FLAGS = ["-shared", "-fPIC", "-O3", "-Wno-deprecated-declarations",
               "-Wno-interference-size"]
if platform.machine() == "x86_64":
    EXTRA_FLAGS.append("-march=x86-64-v2")  # SSE4.2/POPCNT: every CPU that runs TF's wheel


def _tf_flags():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf.__version__, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()


def _ucx_flags():
    """(include dir, lib dir) of the installed libucx wheel, or None without it."""
    try:
        import libucx  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    root = pathlib.Path(libucx.__file__).resolve().parent
    return str(root / "include"), str(root / "lib")


# TensorFlow's framework headers that most sources include, compiled once into a
# precompiled header (GCC's .gch) that every source then includes first: each source
# parses them in about a quarter of the time. g++ ignores a .gch it cannot use and reads
# the headers themselves, so a stale or mismatched one costs time, never correctness.
PRECOMPILED_HEADERS = ("tensorflow/core/framework/op_kernel.h",
                       "tensorflow/core/framework/op.h",
                       "tensorflow/core/framework/shape_inference.h",
                       "tensorflow/core/framework/common_shape_fns.h",
                       "tensorflow/core/framework/tensor.h")


def _compile(source, obj, compile_flags):
    cmd = ["g++", "-c", str(source), "-o", str(obj)] + EXTRA_FLAGS + compile_flags
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return source, result


def _precompile(temp, compile_flags):
    """Flags that make a source include the precompiled TF headers, or [] if it failed.

    The .gch is built once per set of TF's flags and kept in the build folder: both
    libraries use it (the UCX headers' include path is added after it).
    """
    header = temp / "tf_framework.h"
    stamp = temp / "tf_framework.flags"
    text = "".join(f'#include "{h}"\n' for h in PRECOMPILED_HEADERS)
    key = json.dumps([text, EXTRA_FLAGS, compile_flags])
    if not (stamp.exists() and stamp.read_text() == key):
        header.write_text(text)
        cmd = (["g++", "-x", "c++-header", str(header), "-o", str(header) + ".gch"]
               + EXTRA_FLAGS + compile_flags)
        if subprocess.run(cmd, capture_output=True, text=True, check=False).returncode != 0:
            return []
        stamp.write_text(key)
    return ["-include", str(header)]


class BuildTfOps(build_ext):
    """Compiles custom_ops/ into one TF op library with tf.sysconfig flags."""

    def build_extension(self, ext):
        library = pathlib.Path(self.get_ext_fullpath(ext.name))
        library.parent.mkdir(parents=True, exist_ok=True)
        ucx = ext.name.endswith("_tfdist_ucx")
        name = UCX_BUILD_INFO_NAME if ucx else BUILD_INFO_NAME
        # The stamp goes beside the built library and into the source package, so
        # both editable and regular installs carry it.
        info_paths = {library.parent / name, ROOT / OPS_PACKAGE_DIR / name}
        try:
            tf_version, compile_flags, link_flags = _tf_flags()
        except ImportError as err:
            self._give_up(info_paths, f"TensorFlow is not importable ({err})")
            return
        custom_ops = ROOT / "custom_ops"
        if ucx:
            paths = _ucx_flags()
            if paths is None:
                # Optional: the engine reports this and TF's collectives are used.
                _write_info(info_paths, {"error": "the libucx-cu12 wheel was not installed "
                                                  "when the ops were built"})
                return
            sources = sorted((custom_ops / UCX_SOURCES).rglob("*.cc"))
            library_flags = ["-I" + paths[0]]
            link_flags = link_flags + ["-L" + paths[1], "-lucp", "-lucs",
                                       "-Wl,-rpath," + paths[1]]
        else:
            sources = sorted(s for s in custom_ops.rglob("*.cc")
                             if UCX_SOURCES not in s.relative_to(custom_ops).parts[:1])
            library_flags = []
        problem = self._build(sources, library, tf_version, compile_flags, link_flags,
                              library_flags)
        if problem:
            self._give_up(info_paths, problem)
            return
        _write_info(info_paths, {"tf_version": tf_version,
                                 "compile_flags": library_flags + compile_flags,
                                 "link_flags": link_flags,
                                 "sources": [s.name for s in sources]})
        print(f"tfdist_ext: built {library} for TensorFlow {tf_version}")

    def _build(self, sources, library, tf_version, compile_flags, link_flags, library_flags):
        """Compiles `sources` in parallel and links `library`; returns a problem or None.

        `compile_flags` are TF's, `library_flags` this library's own (include paths).
        """
        temp = pathlib.Path(self.build_temp)
        temp.mkdir(parents=True, exist_ok=True)
        objects = [temp / (s.relative_to(ROOT).as_posix().replace("/", "_") + ".o")
                   for s in sources]
        includes = ["-I" + str(ROOT / "custom_ops"), f'-DTFDIST_TF_VERSION="{tf_version}"']
        includes += _precompile(temp, includes + compile_flags) + library_flags
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            results = list(pool.map(lambda so: _compile(so[0], so[1], includes + compile_flags),
                                    zip(sources, objects)))
        failed = [(s, r) for s, r in results if r.returncode != 0]
        if failed:
            for source, result in failed:
                sys.stderr.write(f"--- g++ failed on {source}:\n{result.stderr}\n")
            return f"compiling {len(failed)} source(s) failed"
        cmd = (["g++"] + [str(o) for o in objects] + ["-o", str(library)]
               + EXTRA_FLAGS + link_flags)
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            sys.stderr.write(result.stderr)
            return f"linking {library.name} failed"
        return None

    @staticmethod
    def _give_up(info_paths, reason):
        _write_info(info_paths, {"error": reason})
        raise CCompilerError(
            f"tfdist_ext custom ops were not built: {reason}. The package installs "
            "without them; the features that need them raise until rebuilt with "
            "`python setup.py build_ext --inplace`.")


def _write_info(paths, info):
    for path in paths:
        path.write_text(json.dumps(info, indent=1))


setup(
    name="tfdist_ext",
    version="0.1.0",
    description="Communication-efficient distributed training for Keras 3 / TensorFlow 2.19-2.21",
    packages=find_packages(include=["tfdist_ext", "tfdist_ext.*"]),
    python_requires=">=3.11",  # 3.11 tested; Keras >= 3.13 needs it
    # TensorFlow itself is an extra so GPU users keep `tensorflow` instead of
    # getting `tensorflow-cpu` beside it; it must be installed before building.
    install_requires=["keras>=3.10.0,<3.16", "numpy>=2.1.3,<2.5", "tensorboard>=2.19.0,<2.22"],
    extras_require={"cpu": ["tensorflow-cpu>=2.19.1,<2.22"], "gpu": ["tensorflow>=2.19.1,<2.22"],
                    "ucx": ["libucx-cu12>=1.22.0,<1.23"],
                    # Gloo rows of bench/engines.py, PyTorch DDP and Keras on JAX in bench/step.py;
                    # scikit-learn's datasets in bench/modes_matrix.py (not in the test set:
                    # Keras imports it when installed, 1.5 s more per TensorFlow process)
                    "bench": ["torch>=2.13,<2.14", "jax>=0.10.2,<0.11",
                              "scikit-learn>=1.9.1,<1.10"],
                    "examples": ["mnist1d>=0.0.2.post1,<0.1", "matplotlib>=3.11.2,<3.12"],
                    "ray": ["ray[train]>=2.60.0,<2.61"],
                    "test": ["pytest>=9.0.3,<9.3", "pytest-xdist>=3.8.0,<3.9",
                             "ray[train]>=2.60.0,<2.61",
                             "mnist1d>=0.0.2.post1,<0.1",
                             "matplotlib>=3.11.2,<3.12"]},
    ext_modules=[Extension("tfdist_ext.ops._tfdist_ops", sources=[], optional=True),
                 Extension("tfdist_ext.ops._tfdist_ucx", sources=[], optional=True)],
    cmdclass={"build_ext": BuildTfOps},
    package_data={"tfdist_ext.ops": [BUILD_INFO_NAME, UCX_BUILD_INFO_NAME]},
    entry_points={"console_scripts": ["tfdist-run=tfdist_ext.launch.cli:main"]},
)
