"""ResourceMeter: exact RAPL deltas, wraparound, honest 'unavailable' readings."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import psutil
import pytest
import torch

from graphwire.run.meter import ResourceMeter, ResourceReading


def _zone(root: Path, name: str, energy: int, max_range: int) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_range}\n")
    return zone


def _set(zone: Path, energy: int) -> None:
    (zone / "energy_uj").write_text(f"{energy}\n")


@pytest.fixture
def rapl(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    root = tmp_path / "powercap"
    z0 = _zone(root, "intel-rapl:0", 1_000_000, 262_143_328_850)
    z1 = _zone(root, "intel-rapl:1", 5_000_000, 262_143_328_850)
    sub = _zone(root, "intel-rapl:0:0", 7_000_000, 262_143_328_850)
    (root / "dtpm").mkdir()  # unrelated powercap entry
    return root, z0, z1, sub


def test_rapl_sums_package_deltas_and_ignores_subzones(rapl) -> None:
    root, z0, z1, sub = rapl
    meter = ResourceMeter(powercap_root=root)
    meter.start()
    _set(z0, 3_500_000)  # +2.5 J
    _set(z1, 5_250_000)  # +0.25 J
    _set(sub, 900_000_000)  # subzone: must not count
    reading = meter.stop()
    assert reading.energy_j == pytest.approx(2.75, abs=1e-12)
    assert reading.energy_source == "rapl:intel-rapl:0,intel-rapl:1"


def test_rapl_wraparound(tmp_path: Path) -> None:
    root = tmp_path / "powercap"
    z0 = _zone(root, "intel-rapl:0", 9_000_000, 10_000_000)
    z1 = _zone(root, "intel-rapl:1", 100, 10_000_000)
    meter = ResourceMeter(powercap_root=root)
    meter.start()
    _set(z0, 500_000)  # wrapped: (10e6 - 9e6 + 0.5e6) uJ = 1.5 J
    _set(z1, 100)  # unchanged
    reading = meter.stop()
    assert reading.energy_j == pytest.approx(1.5, abs=1e-12)


def test_missing_root_is_unavailable(tmp_path: Path) -> None:
    meter = ResourceMeter(powercap_root=tmp_path / "nope")
    meter.start()
    reading = meter.stop()
    assert reading.energy_j is None
    assert reading.energy_source.startswith("unavailable")


def test_root_without_package_zones_is_unavailable(tmp_path: Path) -> None:
    _zone(tmp_path, "intel-rapl:0:0", 1, 10)  # only a subzone
    meter = ResourceMeter(powercap_root=tmp_path)
    meter.start()
    reading = meter.stop()
    assert reading.energy_j is None
    assert reading.energy_source.startswith("unavailable")


def test_energy_file_that_is_a_directory_is_unavailable(tmp_path: Path) -> None:
    zone = tmp_path / "intel-rapl:0"
    (zone / "energy_uj").mkdir(parents=True)
    meter = ResourceMeter(powercap_root=tmp_path)
    meter.start()
    reading = meter.stop()
    assert reading.energy_j is None
    assert reading.energy_source.startswith("unavailable")


def test_permission_error_is_unavailable(rapl, monkeypatch) -> None:
    root = rapl[0]

    def denied(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", denied)
    meter = ResourceMeter(powercap_root=root)
    meter.start()
    reading = meter.stop()
    assert reading.energy_j is None
    assert reading.energy_source.startswith("unavailable")
    assert "PermissionError" in reading.energy_source


def test_permission_error_at_stop_is_unavailable(rapl, monkeypatch) -> None:
    root = rapl[0]
    meter = ResourceMeter(powercap_root=root)
    meter.start()

    def denied(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", denied)
    reading = meter.stop()
    assert reading.energy_j is None
    assert "PermissionError" in reading.energy_source


def test_cpu_time_grows_when_burning_cpu(tmp_path: Path) -> None:
    # Burn 0.2 s of this thread's CPU, not of wall time: on a loaded machine
    # (the suite under pytest-xdist with 15 workers on 16 cores) 0.2 s of
    # wall time gave this process under 0.05 s of CPU.
    meter = ResourceMeter(powercap_root=tmp_path)
    meter.start()
    burnt = time.thread_time() + 0.2
    x = 0
    while time.thread_time() < burnt:
        x = (x * 31 + 7) % 1_000_003
    reading = meter.stop()
    assert reading.wall_s >= 0.2  # one thread's CPU time never outruns the wall
    assert reading.cpu_s >= 0.2
    # No more than every thread of this process busy all along (torch's
    # threads may still spin after an earlier test: one busy thread plus
    # slack was exceeded on a 16-core machine).
    assert reading.cpu_s <= reading.wall_s * max(2, psutil.Process().num_threads())


def test_peak_rss_positive_and_non_decreasing(tmp_path: Path) -> None:
    meter = ResourceMeter(powercap_root=tmp_path)
    meter.start()
    first = meter.stop()
    meter.start()
    blob = bytearray(32 * 1024 * 1024)  # touch some memory
    blob[::4096] = b"\x01" * len(blob[::4096])
    second = meter.stop()
    assert first.peak_rss_mb > 0
    assert second.peak_rss_mb >= first.peak_rss_mb


def test_stop_before_start_raises() -> None:
    with pytest.raises(RuntimeError):
        ResourceMeter().stop()


def test_gpu_unavailable_without_cuda(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: GPU energy may be available")
    meter = ResourceMeter(powercap_root=tmp_path)
    meter.start()
    reading = meter.stop()
    assert reading.gpu_energy_j is None
    assert reading.gpu_energy_source == "unavailable: no CUDA device"


def test_gpu_energy_from_fake_nvml(tmp_path: Path, monkeypatch) -> None:
    counter = iter([1_000_000, 1_004_500])  # millijoules
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: ("handle", index),
        nvmlDeviceGetTotalEnergyConsumption=lambda handle: next(counter),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    meter = ResourceMeter(powercap_root=tmp_path)
    meter.start()
    reading = meter.stop()
    assert reading.gpu_energy_j == pytest.approx(4.5)
    assert reading.gpu_energy_source == "nvml:cuda:0"


def test_gpu_without_pynvml(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    meter = ResourceMeter(powercap_root=tmp_path)
    meter.start()
    reading = meter.stop()
    assert reading.gpu_energy_j is None
    assert reading.gpu_energy_source == "unavailable: pynvml not installed"


def test_as_dict_is_json_ready(rapl) -> None:
    meter = ResourceMeter(powercap_root=rapl[0])
    meter.start()
    reading = meter.stop()
    assert isinstance(reading, ResourceReading)
    data = json.loads(json.dumps(reading.as_dict()))
    assert set(data) == {
        "wall_s",
        "cpu_s",
        "peak_rss_mb",
        "energy_j",
        "energy_source",
        "gpu_energy_j",
        "gpu_energy_source",
    }
    assert data["energy_j"] == 0.0
    with pytest.raises(AttributeError):
        reading.cpu_s = 1.0  # type: ignore[misc]
