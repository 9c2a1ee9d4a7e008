"""A worker process the launcher supervises, and how its exit reads."""

import dataclasses
import os
import signal
import subprocess
from typing import Optional


@dataclasses.dataclass
class Worker:
    index: int
    process: subprocess.Popen
    returncode: Optional[int] = None
    server: bool = False  # a parameter server ("ps" task), not a worker
    member_file: Optional[str] = None  # elastic: a replacement creates it once in the job

    @property
    def member(self) -> bool:
        """Whether it is in the job: started with it, or a replacement that joined."""
        return self.member_file is None or os.path.exists(self.member_file)

    @property
    def label(self) -> str:
        """The output prefix: the worker index, or "ps" and the server index."""
        return f"ps{self.index}" if self.server else str(self.index)

    @property
    def name(self) -> str:
        return f"parameter server {self.index}" if self.server else f"worker {self.index}"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def shell_code(code: int) -> int:
    """A process's return code as a shell would report it (128+N for signals)."""
    return 128 - code if code < 0 else code
