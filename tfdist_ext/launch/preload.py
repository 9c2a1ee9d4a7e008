"""Workers forked from a process that has already imported TensorFlow and Keras.

A worker spends most of a short job importing: ``import tensorflow, keras`` takes
seconds of CPU, and every worker of every job (and every replacement an elastic job
starts) pays it again. With ``tfdist-run --preload tensorflow,keras`` (or
``TFDIST_PRELOAD``) the launcher starts one template process
(`tfdist_ext.launch.template`) that imports the modules once, and forks each worker
from it: the worker begins with the modules in memory, shared copy-on-write, and runs
the script as ``python script.py`` would (its own session, ``sys.argv``,
``sys.path[0]``, the environment the launcher gives it, Python's exit codes and
shutdown).

The launcher makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``) while the
template runs, so forked workers become its children: it waits for them, signals
their process groups and reads their output as it does for workers it executes.

Applies only to ``python script.py ...`` or ``python -m module ...`` (``-u``
allowed) with the launcher's own interpreter, outside the network test bed (whose
workers run in namespaces); any other command is executed as usual. Tuning: preload
what every worker imports first (``tensorflow,keras``); a module that starts threads
or creates TensorFlow's runtime at import must not be preloaded (a forked worker
inherits no threads). A variable TensorFlow reads at import has the template's value,
which is the workers' environment without ``TF_CONFIG``.
"""

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
from typing import List, Optional, Sequence

VARIABLE = "TFDIST_PRELOAD"
# Run by path, not `-m tfdist_ext.launch.template`: importing the package would set up
# tfdist_ext for the template's environment before any worker's TF_CONFIG is known.
TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template.py")
_PR_SET_CHILD_SUBREAPER = 36


class PreloadError(RuntimeError):
    """The template could not import the modules it was asked to preload."""


def modules_from(value: Optional[str]) -> List[str]:
    """The module names of a ``--preload`` / ``TFDIST_PRELOAD`` value ("" or None: none).

    Raises:
        ValueError: a name that is not a dotted Python identifier.
    """
    names = [name.strip() for name in (value or "").split(",") if name.strip()]
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(
                f"--preload / {VARIABLE}: {name!r} is not a module name; give "
                "comma-separated module names, e.g. 'tensorflow,keras'.")
    return names


def python_arguments(command: Sequence[str]) -> Optional[List[str]]:
    """The script or ``-m module`` part of `command` if it runs this interpreter, else None."""
    if not command:
        return None
    program = shutil.which(command[0])
    if program is None or os.path.realpath(program) != os.path.realpath(sys.executable):
        return None
    rest = list(command[1:])
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if rest[:1] == ["-m"] and len(rest) >= 2:
        return rest
    if rest and not rest[0].startswith("-") and os.path.isfile(rest[0]):
        return rest
    return None


def _set_subreaper(on: bool):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


class ForkedProcess:
    """A worker forked by the template: the parts of `subprocess.Popen` the launcher uses."""

    def __init__(self, pid: int, stdout):
        self.pid = pid
        self.stdout = stdout
        self.returncode: Optional[int] = None

    def _reap(self, flags: int) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> Optional[int]:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        return self._reap(0)


class Template:
    """One template process that imports `modules` and forks workers on request.

    Args:
        modules: Module names to import once (e.g. ``["tensorflow", "keras"]``).
        env: The template's environment: the workers' without what differs per worker.
    """

    def __init__(self, modules: Sequence[str], env: dict):
        _set_subreaper(True)
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._process = subprocess.Popen(
            [sys.executable, TEMPLATE, str(theirs.fileno()), ",".join(modules)],
            env=env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs.close()
        self.modules = list(modules)
        self._ready = False

    def _answer(self) -> dict:
        data = self._socket.recv(1 << 20)
        if not data:
            code = self._process.wait()
            raise PreloadError(f"the preload template exited with code {code}")
        answer = json.loads(data)
        if "error" in answer:
            raise PreloadError(f"preloading {','.join(self.modules)} failed:\n"
                               f"{answer['error']}")
        return answer

    def start(self, arguments: Sequence[str], env: dict) -> ForkedProcess:
        """Forks a worker running `arguments` (`python_arguments`) with `env`.

        Raises:
            PreloadError: the template could not import the modules, or died.
        """
        if not self._ready:
            self._answer()
            self._ready = True
        read, write = os.pipe()
        try:
            request = {"argv": list(arguments), "env": dict(env), "cwd": os.getcwd()}
            socket.send_fds(self._socket, [json.dumps(request).encode()], [write])
        finally:
            os.close(write)
        try:
            pid = self._answer()["pid"]
        except BaseException:
            os.close(read)
            raise
        return ForkedProcess(pid, os.fdopen(read, "rb", buffering=0))

    def close(self):
        """Stops the template (its workers go on) and ends the launcher's subreaping."""
        self._socket.close()
        try:
            self._process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        _set_subreaper(False)
