"""Per-epoch resource and energy readings for training loops.

``ResourceMeter`` measures one interval (typically one epoch)::

    meter = ResourceMeter()
    meter.start()
    ...  # train one epoch
    reading = meter.stop()

What is measured:

* ``wall_s``: elapsed wall-clock time (``time.perf_counter``).
* ``cpu_s``: user + system CPU time of this process over the interval, all
  threads included (``time.process_time``).
* ``peak_rss_mb``: peak resident set size of the process so far, in MiB
  (``getrusage(RUSAGE_SELF).ru_maxrss``, which Linux reports in KiB).
* ``energy_j``: CPU package energy from RAPL powercap counters, summed over the
  top-level package zones (``intel-rapl:N``; subzones such as ``intel-rapl:N:M``
  are skipped so nothing is counted twice), with counter wraparound handled via
  ``max_energy_range_uj``.
* ``gpu_energy_j``: energy of the current CUDA device from NVML
  (``nvmlDeviceGetTotalEnergyConsumption``), when CUDA and ``pynvml`` exist.

A reading that cannot be taken is reported as ``None`` with an
``"unavailable: <reason>"`` source string. Nothing is ever estimated: there are
no power models and no TDP-based guesses.
"""

from __future__ import annotations

import dataclasses
import re
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PACKAGE_ZONE = re.compile(r"^(intel|amd)-rapl:\d+$")


@dataclass(frozen=True)
class ResourceReading:
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    energy_j: float | None
    energy_source: str
    gpu_energy_j: float | None
    gpu_energy_source: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict of all fields."""
        return dataclasses.asdict(self)


def peak_rss_mb() -> float:
    """Peak RSS of this process so far, in MiB."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS reports bytes.
    return maxrss / (1024 * 1024) if sys.platform == "darwin" else maxrss / 1024


def _rapl_zones(root: Path) -> list[Path]:
    if not root.is_dir():
        raise OSError(f"{root} not found")
    zones = sorted(p for p in root.iterdir() if _PACKAGE_ZONE.match(p.name))
    if not zones:
        raise OSError(f"no RAPL package zones under {root}")
    return zones


def _read_uj(path: Path) -> int:
    return int(path.read_text().strip())


class ResourceMeter:
    """Measures wall time, CPU time, peak RSS and CPU/GPU energy of an interval."""

    def __init__(self, powercap_root: str | Path = "/sys/class/powercap") -> None:
        self.powercap_root = Path(powercap_root)
        self._t0: float | None = None
        self._cpu0 = 0.0
        self._rapl0: dict[Path, int] | None = None
        self._rapl_reason = ""
        self._gpu0: int | None = None
        self._gpu_reason = ""
        self._gpu_handle: Any = None
        self._nvml: Any = None

    def _read_rapl(self) -> dict[Path, int]:
        return {z: _read_uj(z / "energy_uj") for z in _rapl_zones(self.powercap_root)}

    def _gpu_mj(self) -> int:
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._gpu_handle))

    def _start_gpu(self) -> None:
        self._gpu0, self._gpu_handle, self._nvml = None, None, None
        import torch

        if not torch.cuda.is_available():
            self._gpu_reason = "unavailable: no CUDA device"
            return
        try:
            import pynvml
        except ImportError:
            self._gpu_reason = "unavailable: pynvml not installed"
            return
        try:
            pynvml.nvmlInit()
            index = torch.cuda.current_device()
            self._nvml = pynvml
            self._gpu_handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._gpu0 = self._gpu_mj()
            self._gpu_reason = f"nvml:cuda:{index}"
        except Exception as exc:  # NVMLError subclasses, driver quirks
            self._gpu0 = None
            self._gpu_reason = f"unavailable: {type(exc).__name__}: {exc}"

    def start(self) -> None:
        """Begin an interval (re-calling restarts it)."""
        try:
            self._rapl0 = self._read_rapl()
            self._rapl_reason = "rapl:" + ",".join(z.name for z in self._rapl0)
        except (OSError, ValueError) as exc:
            self._rapl0 = None
            self._rapl_reason = f"unavailable: {type(exc).__name__}: {exc}"
        self._start_gpu()
        self._cpu0 = time.process_time()
        self._t0 = time.perf_counter()

    def stop(self) -> ResourceReading:
        """End the interval and return its reading."""
        if self._t0 is None:
            raise RuntimeError("ResourceMeter.stop() called before start()")
        wall = time.perf_counter() - self._t0
        cpu = time.process_time() - self._cpu0
        self._t0 = None
        energy, source = None, self._rapl_reason
        if self._rapl0 is not None:
            try:
                total = 0
                for zone, before in self._rapl0.items():
                    after = _read_uj(zone / "energy_uj")
                    if after < before:  # counter wrapped
                        after += _read_uj(zone / "max_energy_range_uj")
                    total += after - before
                energy = total / 1e6
            except (OSError, ValueError) as exc:
                source = f"unavailable: {type(exc).__name__}: {exc}"
        gpu_energy, gpu_source = None, self._gpu_reason
        if self._gpu0 is not None:
            try:
                gpu_energy = (self._gpu_mj() - self._gpu0) / 1e3
            except Exception as exc:
                gpu_source = f"unavailable: {type(exc).__name__}: {exc}"
        return ResourceReading(
            wall_s=wall,
            cpu_s=cpu,
            peak_rss_mb=peak_rss_mb(),
            energy_j=energy,
            energy_source=source,
            gpu_energy_j=gpu_energy,
            gpu_energy_source=gpu_source,
        )
