"""What `tfdist-run` shows of its workers' output: one live progress bar, each line once.

Every worker of a data-parallel job prints the same thing: N progress bars,
N model summaries, N copies of each epoch's metrics. Keras draws its bar by
rewriting one line (`\\r`, backspaces) without a newline, so a reader that
waits for whole lines shows nothing during an epoch and then every worker's
bar at once, and a `\\r` overwrites the `[k]` prefix. `Output` reads the
workers' streams as they come and shows:

* the progress worker's bar (worker 0, or the one `--output N` names), live
  on a terminal (redrawn in place, behind its `[k]` prefix, under the lines
  printed meanwhile); in a log file only the finished bar Keras ends with a
  newline;
* with mode "chief" (the default), a line of another worker only when
  neither the chief nor another worker printed it (comparing text without
  colours and timings, so "8/8 - 1s - 73ms/step - loss: 0.67" from two
  workers is one line, and losses that differ are both shown). Such a line
  waits up to `HOLD_SECONDS` for the chief's copy, which is shown instead;
  with "all", every line of every worker; with a worker index N, only worker
  N's lines.

Lines TF's C++ runtime prints that say nothing a user can act on (`NOISE`)
are dropped unless `verbose`.
"""

import re
import threading
import time
from typing import Dict, List, Optional, Tuple, Union

# Lines TF / gRPC / absl print that say nothing a user can act on.
NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)"
    r"|[IW]\d{4} [\d:.]+\s+\d+ \S+\.(cc|h):\d+\]"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|To enable the following instructions: .* rebuild TensorFlow"
    r"|WARNING:tensorflow:Collective ops is not configured at program startup)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TIMING = re.compile(r"\d+(\.\d+)?(s|ms|us|µs)(/(step|sample))?\b|\b\d+:\d\d(:\d\d)?\b")
_CUT_ESCAPE = re.compile(r"\x1b(\[[0-9;]*)?$")  # a colour code the next read completes
_BREAK = re.compile(r"(\r\n|\r|\n)")
_CLEAR = "\r\x1b[K"
_MAX_REMEMBERED = 100_000  # distinct lines compared across workers
# Seconds another worker's line waits for the chief's copy before it is shown.
HOLD_SECONDS = 1.0
MODES = ("chief", "all")


def check_mode(value: str) -> Union[str, int]:
    """"chief", "all" or a worker index (>= 0), as `--output` takes it.

    Raises:
        ValueError: naming the value and what is allowed.
    """
    if value in MODES:
        return value
    if value.isdigit():
        return int(value)
    raise ValueError(f"must be 'chief' (each line once, worker 0's progress bar), 'all' "
                     f"(every worker's lines) or a worker index such as 1; received "
                     f"{value!r}")


class Output:
    """Merges worker streams onto `out` (thread-safe: one pump thread per worker).

    Args:
        out: The text stream to write to.
        mode: "chief", "all" or a worker index (see the module doc).
        verbose: Also show `NOISE` lines.
        live: Redraw the progress bar in place; defaults to `out.isatty()`.
    """

    def __init__(self, out, mode: Union[str, int] = "chief", verbose: bool = False,
                 live: Optional[bool] = None):
        self.out = out
        self.mode = mode
        self.verbose = verbose
        self.live = out.isatty() if live is None else live
        self._progress_label = str(mode) if isinstance(mode, int) else "0"
        self._lock = threading.Lock()
        self._partial: Dict[str, str] = {}
        self._seen: Dict[str, Dict[str, int]] = {}
        self._bar: Optional[str] = None  # the live bar as drawn, prefix included
        self._held: List[Tuple[float, str, str, str]] = []  # (since, label, key, line)
        self.hold_seconds = HOLD_SECONDS

    def feed(self, label: str, text: str) -> None:
        """Takes what worker `label` wrote next (any piece of its stream)."""
        with self._lock:
            pieces = _BREAK.split(self._partial.pop(label, "") + text)
            for segment, end in zip(pieces[0:-1:2], pieces[1::2]):
                if end != "\r":  # a "\r" ends a bar superseded by the next one
                    self._line(label, segment.replace("\b", ""))
            tail = pieces[-1]
            self._partial[label] = tail
            bar = tail.replace("\b", "")
            if (self.live and label == self._progress_label and bar.strip()
                    and not _CUT_ESCAPE.search(bar)):
                self._draw(f"[{label}] {bar}")
            self.out.flush()

    def end(self, label: str) -> None:
        """Worker `label`'s stream ended: what it left unterminated is a line."""
        with self._lock:
            rest = self._partial.pop(label, "").replace("\b", "")
            if rest.strip():
                self._line(label, rest)
            self._release(time.monotonic() - self.hold_seconds, label)
            if label == self._progress_label:
                self._erase()
            self.out.flush()

    def say(self, line: str) -> None:
        """A line of the launcher's own."""
        with self._lock:
            self._release(time.monotonic() - self.hold_seconds)
            self._write(line)
            self.out.flush()

    def _line(self, label: str, line: str) -> None:
        if not self.verbose and NOISE.match(line):
            return
        if label == self._progress_label:
            self._erase()  # the bar's worker moved on to a new line
        elif isinstance(self.mode, int):
            return
        if self.mode != "chief":
            self._write(f"[{label}] {line}")
            return
        key = _TIMING.sub("", _ANSI.sub("", line)).strip()
        counts = self._seen.setdefault(key, {})
        counts[label] = counts.get(label, 0) + 1
        if label == self._progress_label:
            held = [h for h in self._held if h[2] == key]
            for item in held:  # the chief's copy is shown instead
                self._held.remove(item)
            if held or not self._seen_elsewhere(counts, label):
                self._write(f"[{label}] {line}")
        elif not self._seen_elsewhere(counts, label):
            self._held.append((time.monotonic(), label, key, line))
        self._release(time.monotonic() - self.hold_seconds)

    @staticmethod
    def _seen_elsewhere(counts: Dict[str, int], label: str) -> bool:
        """Whether another worker printed this line as often as `label` now has."""
        return any(count >= counts[label] for other, count in counts.items()
                   if other != label)

    def _release(self, before: float, label: Optional[str] = None) -> None:
        """Prints held lines that arrived before `before` (all of `label`'s)."""
        for item in list(self._held):
            if item[0] < before or item[1] == label:
                self._held.remove(item)
                self._write(f"[{item[1]}] {item[3]}")
        if len(self._seen) > _MAX_REMEMBERED:
            self._seen.clear()

    def _write(self, line: str) -> None:
        bar = self._bar
        if bar is not None:
            self.out.write(_CLEAR)
        self.out.write(line + "\n")
        if bar is not None:
            self.out.write(bar)

    def _draw(self, bar: str) -> None:
        self.out.write(_CLEAR + bar)
        self._bar = bar

    def _erase(self) -> None:
        if self._bar is not None:
            self.out.write(_CLEAR)
        self._bar = None
