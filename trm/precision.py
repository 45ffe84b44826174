"""`train.precision=auto`: bf16 where the device has bf16 units, fp32 where it has none.

A fixed precision is a trap one way or the other: bf16 ran ~20x slower than fp32 on an AVX2-only CPU (no bf16
units: every bf16 op is emulated), while a 2048^2 bf16 matmul ran 7.8x faster than fp32 on a CPU with
avx512_bf16. So `auto` (the default) looks at the hardware once per job and picks a concrete mode:

- bf16 units: TPUs; CUDA GPUs of compute capability >= 8.0 (Ampere on); CPUs with AMX (`amx_bf16`) or
  `avx512_bf16` (Linux /proc/cpuinfo flags). `auto` then picks `train.bf16_mode`: `bf16` (autocast, fp32 carry;
  the default) or `bf16_reference` (carry and activations in bf16, as the TRM reference: `experiment=paper_sudoku`).
- anything else (an AVX2-only CPU, a pre-Ampere GPU, Apple MPS, an unknown device): `fp32`.

An explicit `fp32`, `bf16` or `bf16_reference` always wins (with a warning in the reason when it asks for bf16 on
a device without bf16 units). `resolve_precision` is pure (the device's facts are its input: unit tests pass any
machine they like); `device_facts` gathers the facts of this process's device. The trainer resolves once, before
the workers' agreement check, and makes every worker agree on the result (a pod is homogeneous; a mixed one is
refused). The resolved mode, not `auto`, is what a checkpoint's identity holds (trm/fingerprint.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from contracts.choices import AUTO, BF16_MODES, check_precision_choice

if TYPE_CHECKING:  # torch is read only where a device's facts are: the sweep driver checks a choice without it
    import torch

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPU bf16 units
MIN_CUDA_CAPABILITY = (8, 0)  # Ampere: the first NVIDIA GPUs with bf16 tensor cores


class DeviceFacts(NamedTuple):
    """What `auto` decides from. `device_type` is torch's (`cpu`, `cuda`, `xla`, `mps`, ...); `cpu_flags` is None
    when they could not be read; `xla_hardware` is the PJRT device type under `xla` (`TPU`, `CPU`, `CUDA`)."""

    device_type: str
    cpu_flags: frozenset[str] | None = None
    cuda_capability: tuple[int, int] | None = None
    xla_hardware: str | None = None


class Precision(NamedTuple):
    """The mode the job runs in (one of MODES) and why, e.g. ("bf16", "auto: CPU bf16 units (avx512_bf16)")."""

    mode: str
    reason: str


def _cpu_units(flags: frozenset[str] | None) -> tuple[bool, str]:
    if flags is None:
        return False, "CPU flags unknown (no /proc/cpuinfo)"
    found = [flag for flag in BF16_CPU_FLAGS if flag in flags]
    if found:
        return True, f"CPU bf16 units ({', '.join(found)})"
    return False, f"no bf16 units: the CPU flags lack {' and '.join(BF16_CPU_FLAGS)}"


def _cuda_units(capability: tuple[int, int] | None, what: str = "CUDA") -> tuple[bool, str]:
    if capability is None:
        return False, f"{what} compute capability unknown"
    shown, floor = ".".join(map(str, capability)), ".".join(map(str, MIN_CUDA_CAPABILITY))
    if tuple(capability) >= MIN_CUDA_CAPABILITY:
        return True, f"{what} compute capability {shown} >= {floor} (bf16 tensor cores)"
    return False, f"no bf16 units: {what} compute capability {shown} < {floor}"


def bf16_units(facts: DeviceFacts) -> tuple[bool, str]:
    """Whether the device has bf16 units, and the fact that says so."""
    if facts.device_type == "cpu":
        return _cpu_units(facts.cpu_flags)
    if facts.device_type == "cuda":
        return _cuda_units(facts.cuda_capability)
    if facts.device_type == "xla":
        hardware = (facts.xla_hardware or "").upper()
        if hardware == "TPU":
            return True, "XLA device TPU (bf16 matrix units)"
        if hardware == "CPU":
            has, why = _cpu_units(facts.cpu_flags)
            return has, f"XLA device CPU: {why}"
        if hardware in ("CUDA", "GPU"):
            return _cuda_units(facts.cuda_capability, "XLA GPU")
        return False, f"no bf16 units known for XLA device type {facts.xla_hardware!r}"
    return False, f"no bf16 units known for device type {facts.device_type!r}"


def resolve_precision(requested: str, facts: DeviceFacts, bf16_mode: str = "bf16") -> Precision:
    """The concrete mode for `train.precision=requested` on a device with these facts, and the reason."""
    check_precision_choice(requested, bf16_mode)
    has_units, why = bf16_units(facts)
    if requested != AUTO:
        reason = f"train.precision={requested} (explicit)"
        if requested in BF16_MODES and not has_units:
            reason += f"; warning: {why}, so bf16 is emulated and may be much slower than fp32"
        return Precision(requested, reason)
    return Precision(bf16_mode if has_units else "fp32", f"auto: {why}")


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The first CPU's feature flags (`flags` on x86, `Features` on Arm); None where there is no such file."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _cuda_capability(device: torch.device | None = None) -> tuple[int, int] | None:
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(device)
        return int(major), int(minor)
    except Exception:  # noqa: BLE001 - a broken driver: no facts, so fp32
        return None


def _xla_hardware() -> str | None:
    try:
        import torch_xla.runtime as xr  # an optional dependency: only under the xla backend

        kind: str | None = xr.device_type()
        return kind
    except Exception:  # noqa: BLE001 - torch_xla missing or not set up: no facts, so fp32
        return None


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of this process's device (read from the machine: /proc/cpuinfo, CUDA, the PJRT device type)."""
    kind = device.type
    if kind == "cpu":
        return DeviceFacts(kind, cpu_flags=read_cpu_flags())
    if kind == "cuda":
        return DeviceFacts(kind, cuda_capability=_cuda_capability(device))
    if kind == "xla":
        hardware = _xla_hardware()
        upper = (hardware or "").upper()
        return DeviceFacts(
            kind,
            cpu_flags=read_cpu_flags() if upper == "CPU" else None,
            cuda_capability=_cuda_capability() if upper in ("CUDA", "GPU") else None,
            xla_hardware=hardware,
        )
    return DeviceFacts(kind)
