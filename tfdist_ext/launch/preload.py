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
import select
import shutil
import signal
import socket
import subprocess
import sys
from typing import List, Optional, Sequence

VARIABLE = "TFDIST_PRELOAD"
# Run by path, not `-m tfdist_ext.launch.template`: importing the package would set up
# tfdist_ext for the template's environment before any worker's TF_CONFIG is known.
TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template.py")
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


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
        if name.split(".")[0] == "tfdist_ext":
            raise ValueError(
                f"--preload / {VARIABLE}: {name!r} cannot be preloaded: each worker "
                "imports tfdist_ext itself, for its own TF_CONFIG; preload "
                "'tensorflow,keras'.")
    return names


def python_arguments(command: Sequence[str]) -> Optional[List[str]]:
    """The script or ``-m module`` part of `command` if it runs this interpreter, else None.

    This interpreter: the same executable file in the same environment (a virtual
    environment's ``python`` links to its base interpreter but has its own packages).
    """
    if not command:
        return None
    program = shutil.which(command[0])
    if (program is None or os.path.realpath(program) != os.path.realpath(sys.executable)
            or _environment(program) != _environment(sys.executable)):
        return None
    rest = list(command[1:])
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if rest[:1] == ["-m"] and len(rest) >= 2:
        return rest
    if rest and not rest[0].startswith("-") and os.path.isfile(rest[0]):
        return rest
    return None


def _environment(program: str) -> Optional[str]:
    """The virtual environment `program` belongs to (its pyvenv.cfg), or None."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(program)))
    marker = os.path.join(root, "pyvenv.cfg")
    return root if os.path.isfile(marker) else None


def _subreaper(on: Optional[bool] = None) -> bool:
    """Whether this process is a child subreaper; first sets it when `on` is given."""
    libc = ctypes.CDLL(None, use_errno=True)
    if on is not None and libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    value = ctypes.c_int(0)
    if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_GET_CHILD_SUBREAPER) failed")
    return bool(value.value)


class ForkedProcess:
    """A worker forked by the template: the parts of `subprocess.Popen` the launcher uses."""

    def __init__(self, pid: int, stdout):
        if pid <= 0:
            raise ValueError(f"a forked worker's pid must be positive, not {pid}")
        self.pid = pid
        self.stdout = stdout
        self.returncode: Optional[int] = None

    def _reap(self, flags: int) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): as Popen does
                self.returncode = 0
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> Optional[int]:
        return self._reap(os.WNOHANG)

    def send_signal(self, sig: int):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def wait(self) -> int:
        return self._reap(0)


class Template:
    """One template process that imports `modules` and forks workers on request.

    Args:
        modules: Module names to import once (e.g. ``["tensorflow", "keras"]``).
        env: The template's environment: the workers' without what differs per worker.
        stop: Called while waiting for the template; True gives up (PreloadError), so
            that a signal or timeout of the launcher is not held up by the imports.
    """

    def __init__(self, modules: Sequence[str], env: dict, stop=lambda: False):
        self._was_subreaper = _subreaper()
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            _subreaper(True)
            self._process = subprocess.Popen(
                [sys.executable, TEMPLATE, str(theirs.fileno()), ",".join(modules)],
                env=env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            self._socket.close()
            _subreaper(self._was_subreaper)
            raise
        finally:
            theirs.close()
        self.modules = list(modules)
        self._stop = stop
        self._ready = False

    def _answer(self) -> dict:
        while not select.select([self._socket], [], [], 0.1)[0]:
            if self._stop():
                raise PreloadError("stopped while the preload template was importing")
        try:
            data = self._socket.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            code = self._process.wait()
            raise PreloadError(f"the preload template exited with code {code}")
        answer = json.loads(data)
        if "error" in answer:
            raise PreloadError(f"preloading {','.join(self.modules)} failed:\n"
                               f"{answer['error']}")
        return answer

    def start(self, arguments: Sequence[str], env: dict, cwd: Optional[str] = None,
              output: Optional[int] = None) -> ForkedProcess:
        """Forks a worker running `arguments` (`python_arguments`) with `env` in `cwd`.

        Args:
            arguments: The script and its arguments, or ``-m`` and a module and its.
            env: The worker's whole environment.
            cwd: Its working directory (default: this process's).
            output: A file descriptor for its stdout and stderr (the caller keeps it
                open or closes it); None: a pipe, readable as the result's `stdout`.

        Raises:
            PreloadError: the template could not import the modules, or died.
        """
        if not self._ready:
            self._answer()
            self._ready = True
        read, write = os.pipe() if output is None else (None, output)
        try:
            request = {"argv": list(arguments), "env": dict(env), "cwd": cwd or os.getcwd()}
            socket.send_fds(self._socket, [json.dumps(request).encode()], [write])
            pid = self._answer()["pid"]
        except OSError as error:
            if read is not None:
                os.close(read)
            code = self._process.poll()
            raise PreloadError(f"the preload template did not take the request ({error}"
                               + (f"; it exited with code {code})" if code is not None
                                  else ")")) from None
        except BaseException:
            if read is not None:
                os.close(read)
            raise
        finally:
            if output is None:
                os.close(write)
        return ForkedProcess(pid, None if read is None else os.fdopen(read, "rb", buffering=0))

    def close(self):
        """Stops the template (its workers go on); the launcher's subreaping is as before."""
        self._socket.close()
        try:
            self._process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        _subreaper(self._was_subreaper)
