"""What a host offers a launcher: its GPUs (NVML through nvidia-ml-py, else torch.cuda) and the
NUMA node and CPUs each one sits next to (sysfs). Every reader takes the sysfs root and the GPU
list as arguments, so tests describe a host with a fake tree and a fake list.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("yue2.launcher")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU: its enumeration index, PCI bus id (`0000:3b:00.0`, sysfs spelling), name, UUID."""

    index: int
    pci_bus_id: str
    name: str = ""
    uuid: str = ""
    memory_bytes: int = 0


def parse_cpulist(text: str) -> list[int]:
    """`0-3,8,10-11` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def normalize_bus_id(bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` (or torch's parts) -> sysfs' `0000:3b:00.0`."""
    domain, bus, rest = bus_id.strip().lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest}"


def numa_nodes(sysfs: Path = Path("/sys")) -> dict[int, list[int]]:
    """NUMA node -> its CPUs; {} when the host exposes no node directories."""
    nodes: dict[int, list[int]] = {}
    base = sysfs / "devices/system/node"
    for entry in sorted(base.glob("node[0-9]*")) if base.is_dir() else []:
        cpus = parse_cpulist((entry / "cpulist").read_text()) if (entry / "cpulist").is_file() else []
        if cpus:
            nodes[int(entry.name[4:])] = cpus
    return nodes


def gpu_numa_node(gpu: GpuInfo, sysfs: Path = Path("/sys")) -> int | None:
    """The NUMA node of a GPU's PCI device; None when the kernel does not know (-1) or says nothing."""
    path = sysfs / "bus/pci/devices" / gpu.pci_bus_id / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def discover_gpus() -> list[GpuInfo]:
    """NVML when nvidia-ml-py and a driver are present; torch.cuda otherwise; [] on a CPU host."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # no driver: fall through to torch
            log.info("NVML unavailable (%s); asking torch.cuda", exc)
        else:
            try:
                gpus = []
                for i in range(pynvml.nvmlDeviceGetCount()):
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    bus = pynvml.nvmlDeviceGetPciInfo(h).busId
                    gpus.append(GpuInfo(index=i, pci_bus_id=normalize_bus_id(_text(bus)),
                                        name=_text(pynvml.nvmlDeviceGetName(h)),
                                        uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                                        memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total)))
                return gpus
            finally:
                pynvml.nvmlShutdown()
    return _torch_gpus()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _torch_gpus(dev: Path = Path("/dev")) -> list[GpuInfo]:
    # No NVIDIA device node (nor WSL's /dev/dxg): no CUDA device torch could see, so the launcher
    # skips importing torch (seconds of every worker start on a CPU host).
    if not any(dev.glob("nvidia[0-9]*")) and not (dev / "dxg").exists():
        return []
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        domain, bus, slot = (getattr(p, f"pci_{part}_id", 0) for part in ("domain", "bus", "device"))
        # Indices follow CUDA_DEVICE_ORDER, which the launcher sets to PCI_BUS_ID before asking.
        gpus.append(GpuInfo(index=i, pci_bus_id=f"{domain:04x}:{bus:02x}:{slot:02x}.0", name=p.name,
                            memory_bytes=p.total_memory))
    return gpus


def usable_cpus() -> list[int]:
    """CPUs this process may run on (a cgroup or taskset may allow fewer than the host has)."""
    return sorted(os.sched_getaffinity(0))
