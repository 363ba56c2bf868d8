"""Board power and SM clock while the benchmark times its rows, from an ``nvidia-smi`` sampler.

Why the harness records them: under the GEMM-bound rows the H200 runs at its 700 W board cap
(throttle reason 0x4, software power cap) and its SM clock falls from 1980 MHz to 1170-1605 MHz
(``benchmarks/results/power-h200-cf28578.csv``). Two runs of the same kernels then differ by a few
percent, and a row's clock and power say whether a difference is the kernel's or the board's.

``nvidia-smi -lms`` prints one line per interval; each line carries its own timestamp, so a pipe's
buffering cannot misplace a sample in time. Rows mark the wall-clock windows in which they were
timed (``time.time()``), and :meth:`PowerLog.summary` reduces the samples inside those windows.
Nothing here is needed for a result: where ``nvidia-smi`` is missing or fails, rows carry no
``gpu`` entry and the run goes on.
"""

from __future__ import annotations

import atexit
import bisect
import datetime as _dt
import shutil
import statistics
import subprocess
import threading
from dataclasses import dataclass

# clocks_throttle_reasons.active bits (nvidia-smi --help-query-gpu)
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW thermal, HW thermal, HW power brake
QUERY = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the epoch (the sampler's own timestamp)
    sm_mhz: float
    watts: float
    reasons: int


def parse_line(line: str) -> Sample | None:
    """One ``--format=csv,noheader,nounits`` line of QUERY; None for anything else (a header, a
    message, "[N/A]" fields)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    try:
        stamp = _dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
        return Sample(stamp.timestamp(), float(parts[1]), float(parts[2]), int(parts[3], 16))
    except ValueError:
        return None


class PowerLog:
    """Samples from a running sampler command (QUERY lines on its stdout), read by a daemon thread."""

    def __init__(self, cmd: list[str]):
        self.cmd = cmd
        self.samples: list[Sample] = []
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def nvidia_smi(cls, device: str, interval_ms: int = 100) -> PowerLog | None:
        """A log of one GPU (``device``: nvidia-smi's index or ``GPU-<uuid>``), or None where there
        is no ``nvidia-smi``."""
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        return cls([exe, "-i", device, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                    "-lms", str(interval_ms)])

    def start(self) -> bool:
        try:
            self._proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return False
        self._thread = threading.Thread(target=self._read, name="gpu-power-log", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # a looping nvidia-smi must not outlive a run that ended early
        return True

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            s = parse_line(line)
            if s is not None:
                with self._lock:
                    self.samples.append(s)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self, windows: list[tuple[float, float]]) -> dict | None:
        """The samples taken inside any of ``windows`` ((start, end) in seconds since the epoch),
        reduced; None when there are none (a window shorter than the interval can hold none)."""
        with self._lock:
            samples = list(self.samples)
        times = [s.t for s in samples]  # in order: one sampler, one timestamp per line
        inside: dict[int, Sample] = {}
        for a, b in windows:
            for i in range(bisect.bisect_left(times, a), bisect.bisect_right(times, b)):
                inside[i] = samples[i]
        return reduce_samples(list(inside.values()))


def reduce_samples(samples: list[Sample]) -> dict | None:
    if not samples:
        return None
    n = len(samples)
    mhz = [s.sm_mhz for s in samples]
    watts = [s.watts for s in samples]
    return {
        "samples": n,
        "sm_mhz_median": statistics.median(mhz),
        "sm_mhz_min": min(mhz),
        "watts_median": statistics.median(watts),
        "watts_max": max(watts),
        "power_capped": sum(bool(s.reasons & SW_POWER_CAP) for s in samples) / n,
        "hw_slowdown": sum(bool(s.reasons & HW_SLOWDOWN) for s in samples) / n,
    }
