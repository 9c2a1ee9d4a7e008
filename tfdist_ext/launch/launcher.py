"""Starts N worker processes on this machine, one TF_CONFIG each, and supervises them.

Each worker is its own process group (so a worker's children stop with it),
with TF_CONFIG naming every worker at 127.0.0.1 on a free port (or at its
namespace's address under a `netbed.NetBed`, `--link-bandwidth`). Output lines
are prefixed with the worker index. The job's exit code is the first non-zero
exit code; when a worker fails, the others are stopped (SIGTERM, then SIGKILL
after `grace` seconds) and the launcher says which worker failed and how.
"""

import codecs
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

from tfdist_ext.launch.addresses import free_ports, tf_configs
from tfdist_ext.launch.elastic_env import EXIT_LATE, MEMBER_FILE, REPLACEMENT_DELAY_SECONDS
from tfdist_ext.launch.elastic_env import VARIABLE as ELASTIC_VARIABLE
from tfdist_ext.launch.workers import Worker, describe_exit, shell_code
from tfdist_ext.launch.output import Output
from tfdist_ext.launch import preload as preload_lib

EXIT_TIMEOUT = 124
REPLACEMENT_GRACE_SECONDS = 30.0  # elastic: how long a late replacement may run on alone


# Seconds parameter servers get to exit by themselves once every worker has succeeded.
SERVER_GRACE = 15.0
# Seconds workers get between a forwarded SIGINT / SIGTERM and the SIGTERM + SIGKILL of
# `stop_all`: a `tfdist_ext.Strategy` stops all workers at a common step and writes its
# backups on SIGTERM (`tfdist_ext.keras.preemption`).
PREEMPT_GRACE = 30.0


class Launcher:
    """Runs one job of `num_workers` copies of `command`.

    Args:
        num_workers: Number of worker processes (>= 1).
        command: The program and its arguments.
        timeout: Seconds after which the whole job is stopped (exit code 124),
            or None.
        grace: Seconds between SIGTERM and SIGKILL when stopping workers.
        verbose: Also show TF's C++ log lines that are filtered by default.
        env: Extra environment variables for every worker.
        out: Stream for the prefixed output and the launcher's messages.
        network: A `netbed.NetBed` that is set up (or None): worker i then runs
            in its namespace and TF_CONFIG names the namespaces' addresses; the
            job stops (exit code 1) if `network.problem()` reports one; UCX
            is limited to TCP (``UCX_TLS=tcp`` unless set), so the native
            engine's bytes cross the shaped links like TF's.
        max_restarts: How many times the whole job is started again after a
            worker fails (as torchrun's `--max-restarts`); each restart is
            printed with its cause, and workers see the attempt number in
            `TFDIST_RESTART` (0 at first). Not after a timeout or a signal to
            the launcher. With `keras.callbacks.BackupAndRestore` training
            resumes from the last backup.
        num_servers: Parameter servers ("ps" tasks of TF_CONFIG, on
            127.0.0.1) running the same command; they are not counted in
            `num_workers`, and the job ends when the workers have.
        output: Which workers' lines are shown: "chief" (each line once and
            worker 0's progress bar), "all", or a worker index
            (`tfdist_ext.launch.output`).
        elastic: A worker that fails does not stop the others (they go on
            without it: `tfdist_ext.elastic`), and is started again with its
            TF_CONFIG after `REPLACEMENT_DELAY_SECONDS` to rejoin the running
            job, up to `max_restarts` times in all (not one that exits with
            `EXIT_LATE`: the job runs a later fit than it can join); the job succeeds
            when every worker left does and fails when the last worker in it does
            (replacements not yet admitted, `MEMBER_FILE`, are stopped). Workers get
            ``TFDIST_ELASTIC=1``, which `tfdist_ext.Strategy` reads.
        preload: Module names (``["tensorflow", "keras"]``) imported once by a template
            process that forks the workers (`tfdist_ext.launch.preload`; None reads
            ``TFDIST_PRELOAD``). Other commands than ``python script.py`` / ``python -m
            module`` of this interpreter, and test-bed workers, are executed as usual.
    """

    def __init__(self, num_workers: int, command: Sequence[str], timeout=None, grace=3.0,
                 verbose=False, env=None, out=None, network=None, max_restarts=0,
                 num_servers=0, output="chief", elastic=False, preload=None):
        self.num_workers, self.num_servers = num_workers, num_servers
        self.command, self.timeout, self.grace = list(command), timeout, grace
        self.verbose, self.env, self.elastic = verbose, dict(env or {}), elastic
        if elastic:
            self.env.setdefault(ELASTIC_VARIABLE, "1")
        self.lost: List[int] = []  # workers that died in an elastic job, not replaced
        self._replacements: Dict[int, float] = {}  # elastic: worker -> when it starts again
        self._configs: List[str] = []
        self._others_done = None  # when only replacements were left running
        self._member_dir = None  # elastic: where replacements say they joined (`run`)
        self.out = out or sys.stdout
        self.output = Output(self.out, output, verbose=verbose)
        self.network = network
        self.workers: List[Worker] = []
        self._pumps: List[threading.Thread] = []
        self._stop_signal: Optional[int] = None
        self.max_restarts = max_restarts
        self.restarts = 0
        self._started = None
        self._failure = None  # why the last attempt ended (None: success, timeout or signal)
        self.preload = preload_lib.modules_from(
            os.environ.get(preload_lib.VARIABLE) if preload is None else ",".join(preload))
        self._template: Optional[preload_lib.Template] = None

    def say(self, message: str):
        self.output.say(f"tfdist-run: {message}")

    def _pump(self, worker: Worker):
        stream = worker.process.stdout.fileno()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            data = os.read(stream, 1 << 16)
            self.output.feed(worker.label, decoder.decode(data, final=not data))
            if not data:
                break
        self.output.end(worker.label)

    def _start(self):
        ports = free_ports(self.num_workers + self.num_servers)  # also free in a namespace
        hosts = self.network.addresses if self.network else ["127.0.0.1"] * self.num_workers
        servers = (self.network.server_addresses if self.network
                   else ["127.0.0.1"] * self.num_servers)
        self._configs = tf_configs([f"{h}:{p}" for h, p in zip(hosts, ports)],
                                   [f"{h}:{p}" for h, p in zip(servers,
                                                               ports[self.num_workers:])])
        for number in range(len(self._configs)):
            server = number >= self.num_workers
            self.workers.append(self._start_one(number - self.num_workers if server else number,
                                                server))

    def _start_one(self, index, server=False, member_file=None):
        """Starts worker (or parameter server) `index` with its TF_CONFIG."""
        config = self._configs[index + (self.num_workers if server else 0)]
        # `ip netns exec` execs the command: the pid and process group stay the same.
        command = (self.network.wrap(index, self.command, server=server) if self.network
                   else self.command)
        env = dict(self._common_env(), TF_CONFIG=config,
                   **({MEMBER_FILE: member_file} if member_file else {}))
        arguments = (None if self.network or not self.preload
                     else preload_lib.python_arguments(command))
        process = self._forked(arguments, env) if arguments else None
        if process is None:
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        worker = Worker(index, process, server=server, member_file=member_file)
        pump = threading.Thread(target=self._pump, args=(worker,), daemon=True)
        pump.start()
        self._pumps.append(pump)
        return worker

    def _common_env(self) -> Dict[str, str]:
        """Every worker's environment but TF_CONFIG."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", TFDIST_RESTART=str(self.restarts),
                   **self.env)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        env.setdefault("GRPC_VERBOSITY", "ERROR")
        if self.num_workers + self.num_servers > len(os.sched_getaffinity(0)):
            # More processes than cores: a UCX rank polling for messages would
            # hold a core that a peer needs (tfdist_ext.collectives.ucx_engine).
            env.setdefault("TFDIST_UCX_SPIN_US", "0")
        if self.network:
            # Each namespace stands for a host: UCX must cross the shaped links
            # over TCP, not take shared memory or CMA around them.
            env.setdefault("UCX_TLS", "tcp")
        return env

    def _forked(self, arguments, env):
        """A worker forked from the preload template, or None (then it is executed)."""
        try:
            if self._template is None:
                common = {k: v for k, v in self._common_env().items() if k != "TF_CONFIG"}
                self._template = preload_lib.Template(self.preload, common, self._should_stop)
            return self._template.start(arguments, env)
        except (preload_lib.PreloadError, OSError) as error:
            self.say(f"{error}; starting workers without --preload.")
            self.preload = []
            self._close_template()
            return None

    def _should_stop(self) -> bool:
        """A signal or the timeout came while the launcher waited (for the template)."""
        return self._stop_signal is not None or (
            self.timeout is not None and self._started is not None
            and time.monotonic() - self._started > self.timeout)

    def _close_template(self):
        if self._template is not None:
            self._template.close()
            self._template = None

    def _replace(self, worker: Worker):
        """Elastic: starts a dead worker again (it rejoins the running job) once the
        survivors have noticed the death; or counts it lost."""
        if self.restarts >= self.max_restarts:
            self.lost.append(worker.index)
            self.say(f"the others go on without {worker.name} (--elastic; all "
                     f"{self.max_restarts} replacements of --max-restarts used).")
        else:
            self.restarts += 1
            self._replacements[worker.index] = time.monotonic() + REPLACEMENT_DELAY_SECONDS
            self.say(f"the others go on; {worker.name} starts again in "
                     f"{REPLACEMENT_DELAY_SECONDS:g} s and rejoins (replacement "
                     f"{self.restarts} of {self.max_restarts}, --elastic).")

    def _start_replacements(self):
        for index, when in list(self._replacements.items()):
            if all(w.process.poll() == 0 for w in self.workers if not w.server
                   and w.index not in self.lost and w.index not in self._replacements):
                del self._replacements[index]  # the others finished: nothing to rejoin
                self.lost.append(index)
            elif time.monotonic() >= when:
                del self._replacements[index]
                position = next(i for i, w in enumerate(self.workers)
                                if w.index == index and not w.server)
                self.workers[position] = self._start_one(index, member_file=os.path.join(
                    self._member_dir, f"w{index}-{time.monotonic_ns()}"))
        self._stop_late_replacements()

    def _stop_late_replacements(self):
        """Stops replacements still running `REPLACEMENT_GRACE_SECONDS` after every other
        worker succeeded: they came too late to join (a joined one ends with the others)."""
        workers = [w for w in self.workers if not w.server and w.index not in self.lost]
        late = [w for w in workers if w.member_file and w.process.poll() is None]
        if not late or any(w.process.poll() != 0 for w in workers if w not in late):
            self._others_done = None
            return
        if self._others_done is None:
            self._others_done = time.monotonic()
        elif time.monotonic() - self._others_done > REPLACEMENT_GRACE_SECONDS:
            for worker in late:
                os.killpg(worker.process.pid, signal.SIGKILL)
                worker.process.wait()
                self.lost.append(worker.index)
            self.say(f"stopped worker(s) {[w.index for w in late]}, started again too late "
                     "to rejoin: the others had finished (--elastic).")

    def _signal_all(self, sig):
        for worker in self.workers:
            if worker.process.poll() is None:
                try:
                    os.killpg(worker.process.pid, sig)
                except ProcessLookupError:
                    pass

    def stop_all(self):
        """SIGTERM every live worker group, then SIGKILL what is left after `grace`."""
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(
                w.process.poll() is None for w in self.workers):
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)
        for worker in self.workers:
            worker.process.wait()
            worker.returncode = worker.process.returncode
            try:  # Children a worker left behind in its group.
                os.killpg(worker.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _on_signal(self, signum, _frame):
        self._stop_signal = signum

    def run(self) -> int:
        """Runs the job to the end and returns its exit code."""
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                handlers[sig] = signal.signal(sig, self._on_signal)
        self._started = time.monotonic()
        self._member_dir = tempfile.mkdtemp(prefix="tfdist-members-") if self.elastic else None
        try:
            while True:
                self._failure = None
                code = self._supervise()
                for pump in self._pumps:  # Flush what the workers printed last.
                    pump.join(timeout=2.0)
                if self._failure is None or self.elastic or self.restarts >= self.max_restarts:
                    return code
                self.restarts += 1
                self.say(f"restart {self.restarts} of {self.max_restarts}: {self._failure}; "
                         f"starting all {self.num_workers} workers again.")
                self.workers, self._pumps = [], []
        finally:
            if any(w.process.poll() is None for w in self.workers):
                self.stop_all()  # An exception left workers running.
            self._close_template()
            shutil.rmtree(self._member_dir or "", ignore_errors=True)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _supervise(self) -> int:
        self._start()
        started = self._started if self._started is not None else time.monotonic()
        while True:
            if self._stop_signal is not None:
                name = signal.Signals(self._stop_signal).name
                self.say(f"received {name}; stopping all {self.num_workers} workers "
                         f"(they have {PREEMPT_GRACE:g} s to write their backups).")
                self._signal_all(self._stop_signal)
                deadline = time.monotonic() + PREEMPT_GRACE
                while time.monotonic() < deadline and any(
                        w.process.poll() is None for w in self.workers):
                    time.sleep(0.05)
                self.stop_all()
                return 128 + self._stop_signal
            if self.timeout is not None and time.monotonic() - started > self.timeout:
                self.say(f"timeout of {self.timeout:g} s reached; stopping all workers.")
                self.stop_all()
                return EXIT_TIMEOUT
            problem = self.network.problem() if self.network else None
            if problem is not None:
                self._failure = problem
                self.say(f"network test bed: {problem}; stopping all workers.")
                self.stop_all()
                return 1
            # Servers first: their failure is usually why workers failed too.
            for worker in sorted(self.workers, key=lambda w: not w.server):
                code = worker.process.poll()
                if code is not None and code != 0 and worker.returncode is None:
                    worker.returncode = code
                    others = [w for w in self.workers if not w.server and w is not worker
                              and w.index not in self.lost and w.process.poll() in (None, 0)
                              and w.member]
                    if self.elastic and not worker.server and others:
                        late = code == EXIT_LATE  # the job runs a later fit than its script's
                        self.say(f"{worker.name} (pid {worker.process.pid}) {describe_exit(code)}"
                                 + (" (too late to rejoin: not started again)" if late else "")
                                 + "; the others go on without it (--elastic).")
                        if late or all(w.process.poll() == 0 for w in others):
                            self.lost.append(worker.index)  # (or came back after the end)
                        else:
                            self._replace(worker)
                        continue
                    alive = [w for w in self.workers if w.process.poll() is None]
                    running = [w.index for w in alive if not w.server]
                    servers = [w.index for w in alive if w.server]
                    self._failure = f"{worker.name} {describe_exit(code)}"
                    waiting = sorted({w.index for w in alive if not w.member}
                                     | set(self._replacements))
                    self._replacements = {}
                    self.say(f"{worker.name} (pid {worker.process.pid}) {describe_exit(code)}"
                             + (f", the last worker in the job: worker(s) {waiting} died before"
                                " it and have not rejoined, and there is no job left to rejoin"
                                " (--elastic); the job failed" if waiting else "")
                             + f"; stopping workers {running}"
                             + (f" and parameter servers {servers}." if servers else "."))
                    self.stop_all()
                    return shell_code(code)
            self._start_replacements()
            if all(w.process.poll() == 0 for w in self.workers
                   if not w.server and w.index not in self.lost):
                if self.lost:
                    self.say(f"the job finished without worker(s) {self.lost}, which died "
                             "(--elastic).")
                return self._stop_servers()
            time.sleep(0.05)

    def _stop_servers(self) -> int:
        """After the workers succeeded: lets the servers exit, stops those that do not."""
        deadline = time.monotonic() + SERVER_GRACE
        servers = [w for w in self.workers if w.server]
        while time.monotonic() < deadline and any(w.process.poll() is None for w in servers):
            time.sleep(0.05)
        left = [w.label for w in servers if w.process.poll() is None]
        if left:
            self.say(f"every worker succeeded; stopping parameter server(s) {left}, which "
                     f"did not exit within {SERVER_GRACE:g} s.")
            self.stop_all()
        return 0
