"""The template process of `tfdist_ext.launch.preload`: imports modules once, forks workers.

Run by the launcher as ``python .../template.py FD MODULES`` (by path: it imports
nothing of tfdist_ext, which each worker imports for its own TF_CONFIG): FD is
its end of a Unix socket pair, MODULES a comma-separated list (``tensorflow,keras``).
It imports the modules, says ``{"ready": true}`` (or ``{"error": ...}``), then serves
one request per message: a JSON ``{"argv", "env", "cwd"}`` with the worker's output
pipe attached. For each, a short-lived middle process forks the worker and exits, so
the worker is re-parented to the launcher (a child subreaper) and the launcher waits
for it like any child; the template answers ``{"pid": N}`` once the worker has its own
session and signal handlers (so that a signal the launcher sends it is not lost).

The worker starts its own session (its process group is its pid, as with
``start_new_session``), takes the pipe as stdout and stderr and /dev/null as stdin,
changes to ``cwd``, replaces the environment with ``env`` and runs ``argv`` (a script
or ``-m module``) as ``__main__``, with ``sys.argv`` and ``sys.path[0]`` as Python
sets them; it then leaves through Python's normal shutdown (atexit handlers,
non-daemon threads joined) with the exit code Python would give (an uncaught
KeyboardInterrupt: 130, where Python kills itself with SIGINT).

Only what the modules do at import happens before the environment is replaced: a
variable that TensorFlow or Keras reads at import (``TF_CPP_MIN_LOG_LEVEL``,
``KERAS_BACKEND``) has the value the launcher gave the template, which is the
workers' environment without ``TF_CONFIG``. Nothing may create TensorFlow's runtime
before the fork (no op, no device listing): the template only imports.
"""

import gc
import importlib
import importlib.machinery
import importlib.util
import io
import json
import os
import signal
import socket
import sys
import types

MESSAGE_BYTES = 1 << 22


def _send(sock: socket.socket, message: dict):
    sock.sendall(json.dumps(message).encode())


def _new_main(path: str, loader, spec=None) -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = loader
    main.__spec__ = spec
    main.__package__ = spec.parent if spec is not None else None
    sys.modules["__main__"] = main
    return main


def _run_script(path: str):
    """Runs the file at `path` as `python path` does: in a new __main__ module."""
    main = _new_main(path, importlib.machinery.SourceFileLoader("__main__", path))
    with io.open_code(path) as source:
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)  # pylint: disable=exec-used


def _run_module(name: str, argv):
    """Runs module `name` as `python -m name` does (a package: its __main__)."""
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{name}.__main__")
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    code = spec.loader.get_code(spec.name)
    if code is None:
        raise ImportError(f"No code object available for {name}")
    sys.argv = [spec.origin, *argv]
    main = _new_main(spec.origin, spec.loader, spec)
    exec(code, main.__dict__)  # pylint: disable=exec-used


def _run(request: dict) -> int:
    """Runs the worker's argv as __main__; returns the exit code Python would give.

    An uncaught exception goes to `sys.excepthook`, as in Python; an uncaught
    KeyboardInterrupt gives 130 after the normal shutdown (Python kills itself with
    SIGINT instead, which a shell also reports as 130).
    """
    argv = request["argv"]
    safe_path = getattr(sys.flags, "safe_path", False)  # PYTHONSAFEPATH: no sys.path[0]
    try:
        if argv[0] == "-m":
            if not safe_path:
                sys.path[0] = os.getcwd()
            _run_module(argv[1], argv[2:])
        else:
            sys.argv = list(argv)
            if not safe_path:
                sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
            _run_script(os.path.abspath(argv[0]))
    except SystemExit as stop:
        if stop.code is None:
            return 0
        if isinstance(stop.code, int):
            return stop.code
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:
        _report(stop)
        return 130
    except BaseException as error:  # pylint: disable=broad-except
        _report(error)
        return 1
    return 0


def _report(error: BaseException):
    """Hands `error` to sys.excepthook without the frames of this file."""
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
        frames = frames.tb_next
    sys.excepthook(type(error), error.with_traceback(frames), frames)


def _become_worker(request: dict, output: int, sock: socket.socket, ready: int) -> int:
    os.setsid()
    sock.close()
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Only now may the launcher signal this process group: it learns the pid from here.
    os.write(ready, str(os.getpid()).encode())
    os.close(ready)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _reseed()
    return _run(request)


def _reseed():
    """Gives the worker fresh random state, as a new process has.

    Python's `random` reseeds itself after a fork; NumPy's global generator (behind
    an unseeded `np.random.permutation`) would otherwise be the template's in every
    worker.
    """
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _fork_worker(request: dict, output: int, sock: socket.socket):
    """Returns (worker pid or 0 if the fork failed, None) in the template, (None, exit
    code) in the worker."""
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read)
        try:
            worker = os.fork()
        except OSError:
            os._exit(1)  # pylint: disable=protected-access
        if worker == 0:
            return None, _become_worker(request, output, sock, write)
        os._exit(0)  # pylint: disable=protected-access
    os.close(write)
    os.close(output)
    with os.fdopen(read, "rb") as pipe:
        pid = int(pipe.read() or b"0")  # the worker's, once it is set up (EOF: it failed)
    os.waitpid(middle, 0)  # once the middle process is gone, the worker is the launcher's
    return pid, None


def serve(sock: socket.socket, modules) -> int:
    """Imports `modules`, then forks a worker per request until the launcher hangs up.

    Returns 0 in the template when the launcher closes its end, or the worker's exit
    code in a worker.
    """
    try:
        for name in modules:
            importlib.import_module(name)
    except BaseException as error:  # pylint: disable=broad-except
        _send(sock, {"error": f"{type(error).__name__}: {error}"})
        return 1
    # The imported objects stay put: the collector of each worker skips them instead of
    # touching (and so copying) every page the template shares with it.
    gc.freeze()
    _send(sock, {"ready": True})
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
        except ConnectionError:
            return 0
        if not message:
            return 0
        request = json.loads(message)
        if len(fds) != 1:
            _send(sock, {"error": f"expected the worker's output pipe, got {len(fds)} fds"})
            for fd in fds:
                os.close(fd)
            continue
        pid, code = _fork_worker(request, fds[0], sock)
        if pid is None:
            return code
        _send(sock, {"pid": pid} if pid > 0 else {"error": "fork() failed in the template"})


def main(argv) -> int:
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.getcwd()  # not this folder: its modules would shadow top-level ones
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops its workers itself
    sock = socket.socket(fileno=int(argv[0]))
    return serve(sock, [m for m in argv[1].split(",") if m])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
