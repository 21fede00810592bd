"""GPU utilization and memory over time, sampled through NVML (nvidia-ml-py) in a parent thread.

The sampler runs in the `vmapbench profile` parent, not in the measured process, so it shows up in
neither the py-spy stacks nor the torch.profiler trace. NVML reports the whole device (every
process on it), which is what tells a user whether the GPU was busy or starved.

Every NVML call goes through an injectable module object (`nvml=`), so the tests drive the whole
path with a fake NVML on a machine without a GPU.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

MIB = 1024 * 1024


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; the message says why (the timeline is skipped, the run goes on)."""


@dataclass(frozen=True)
class NvmlSample:
    t: float              # seconds since the sampler started
    gpu_util: float       # percent of the interval a kernel was running
    mem_util: float       # percent of the interval device memory was read or written
    mem_used_mib: float
    mem_total_mib: float


def load_nvml() -> Any:
    """Import pynvml or explain how to get it."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            f"pynvml is not importable ({exc}); install it with `pip install nvidia-ml-py`"
        ) from None
    return pynvml


def cuda_visible_device() -> str | int:
    """The NVML index or UUID of what torch calls `cuda:0`.

    NVML numbers devices physically and ignores CUDA_VISIBLE_DEVICES, so the first visible entry
    is translated here. (NVML and CUDA may still order devices differently unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID; the summary records the device name to make that visible.)
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not visible:
        return 0
    return int(visible) if visible.isdigit() else visible


def open_device(device: str | int = 0, nvml: Any = None) -> tuple[Any, Any]:
    """Initialize NVML and return (nvml module, device handle); raise NvmlUnavailable with the reason."""
    nvml = load_nvml() if nvml is None else nvml
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error as exc:
        if type(exc).__name__ == "NVMLError_LibraryNotFound":
            raise NvmlUnavailable(
                "the NVML library (libnvidia-ml.so) was not found: no NVIDIA driver on this machine, "
                "or the container was started without the driver libraries (docker --gpus all)"
            ) from None
        if type(exc).__name__ == "NVMLError_DriverNotLoaded":
            raise NvmlUnavailable("the NVIDIA kernel driver is not loaded (nvidia-smi fails too)") from None
        raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None
    try:
        if isinstance(device, int):
            handle = nvml.nvmlDeviceGetHandleByIndex(device)
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(device)
    except error as exc:
        nvml.nvmlShutdown()
        raise NvmlUnavailable(f"NVML has no device {device!r} ({exc}); check CUDA_VISIBLE_DEVICES") from None
    return nvml, handle


def device_info(nvml: Any, handle: Any) -> dict[str, str]:
    """Device name and driver version, for the summary (empty strings where NVML refuses)."""
    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    info = {"name": "", "driver": ""}
    try:
        info["name"] = text(nvml.nvmlDeviceGetName(handle))
        info["driver"] = text(nvml.nvmlSystemGetDriverVersion())
    except Exception:  # informational only: never fail a profile over a label
        pass
    return info


class NvmlSampler:
    """Polls one device every `interval` seconds in a daemon thread.

    `mark(label)` records a phase boundary (setup, loop, torch.profiler) at the current time so
    the timeline can shade the phases. Sampling errors stop the thread and land in `.error`.
    """

    def __init__(self, nvml: Any, handle: Any, interval: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval <= 0:
            raise ValueError(f"NvmlSampler: interval must be > 0 seconds, got {interval}")
        self.nvml, self.handle, self.interval, self.clock = nvml, handle, interval, clock
        self.samples: list[NvmlSample] = []
        self.marks: list[tuple[float, str]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def sample_once(self) -> NvmlSample:
        util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        mem = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        sample = NvmlSample(
            t=self.clock() - self._t0,
            gpu_util=float(util.gpu),
            mem_util=float(util.memory),
            mem_used_mib=mem.used / MIB,
            mem_total_mib=mem.total / MIB,
        )
        self.samples.append(sample)
        return sample

    def mark(self, label: str) -> None:
        self.marks.append((self.clock() - self._t0, label))

    def start(self) -> "NvmlSampler":
        self._t0 = self.clock()
        self._thread = threading.Thread(target=self._run, name="vmapbench-nvml", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # a lost GPU must not kill the profile, only the timeline
                self.error = f"NVML sampling stopped: {exc}"
                return
            self._stop.wait(self.interval)

    def stop(self) -> list[NvmlSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval + 1)
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass
        return self.samples

    @property
    def peak_memory_mib(self) -> float | None:
        return max((s.mem_used_mib for s in self.samples), default=None)

    def summary(self) -> dict[str, Any]:
        util = [s.gpu_util for s in self.samples]
        return {
            "samples": len(self.samples),
            "interval_s": self.interval,
            "peak_memory_used_mib": self.peak_memory_mib,
            "memory_total_mib": self.samples[-1].mem_total_mib if self.samples else None,
            "mean_gpu_util": sum(util) / len(util) if util else None,
            "max_gpu_util": max(util, default=None),
            "error": self.error,
        }


def write_timeline(samples: list[NvmlSample], marks: list[tuple[float, str]], path: Path,
                   title: str) -> Path:
    """Write GPU utilization and memory over time as one self-contained Plotly HTML file.

    plotly.js is inlined so the file opens offline; phases between consecutive marks are shaded.
    """
    if not samples:
        raise ValueError("write_timeline: no NVML samples to plot (the run ended before the first sample)")
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    t = [s.t for s in samples]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("utilization (%)", "device memory used (MiB)"))
    fig.add_trace(go.Scatter(x=t, y=[s.gpu_util for s in samples], name="GPU (kernels running)",
                             mode="lines"), row=1, col=1)
    fig.add_trace(go.Scatter(x=t, y=[s.mem_util for s in samples], name="memory bus",
                             mode="lines"), row=1, col=1)
    fig.add_trace(go.Scatter(x=t, y=[s.mem_used_mib for s in samples], name="memory used",
                             mode="lines", fill="tozeroy"), row=2, col=1)
    fig.add_trace(go.Scatter(x=[t[0], t[-1]], y=[samples[-1].mem_total_mib] * 2, name="memory total",
                             mode="lines", line={"dash": "dot"}), row=2, col=1)
    end = t[-1]
    shades = ("rgba(99,110,250,0.08)", "rgba(239,85,59,0.08)")
    for i, (start, label) in enumerate(marks):
        stop = marks[i + 1][0] if i + 1 < len(marks) else end
        if stop <= start:
            continue
        fig.add_vrect(x0=start, x1=stop, fillcolor=shades[i % 2], line_width=0,
                      annotation_text=label, annotation_position="top left")
    fig.update_yaxes(range=[0, 105], row=1, col=1)
    fig.update_xaxes(title_text="seconds since the profile started", row=2, col=1)
    fig.update_layout(title=title, height=620, template="plotly_white", hovermode="x unified")
    path = Path(path)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def samples_as_rows(samples: list[NvmlSample]) -> list[dict[str, float]]:
    return [asdict(s) for s in samples]
