"""The distributed runtime: `init_runtime` picks and starts one from config (`runtime.backend`) and the environment.

- trm/runtime/base.py: the `Runtime` the loop talks to (`single`, and `torch`: DDP), the gloo control plane
  (rank, world size, rendezvous) and the start-up agreement check.
- trm/runtime/xla.py: the `xla` data plane (torch_xla SPMD), a subclass of that `Runtime`. Imported only when the
  backend resolves to `xla` (below, at call time), so the rest of the project never needs torch_xla.

Nothing is re-exported here: import `Runtime` and friends from trm.runtime.base.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from contracts.choices import check_device_choice
from contracts.train_config import RuntimeConfig
from trm.runtime.base import Runtime, resolve_control_plane, start_control_plane, start_data_plane
from trm.runtime.devices import resolve_device


def xla_available() -> bool:
    """`auto` picks `xla` only on a machine set up for it: torch_xla installed and PJRT_DEVICE chosen."""
    return bool(os.environ.get("PJRT_DEVICE")) and importlib.util.find_spec("torch_xla") is not None


def compile_cache_dir(cfg: RuntimeConfig, create: bool) -> str | None:
    """`runtime.compile_cache_dir` checked: None (off), or an absolute local path (`~` expanded); with `create`,
    the directory is made and must be writable. A URL or a non-string is refused: XLA's cache is a local
    directory, one per VM."""
    value = cfg.compile_cache_dir
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"runtime.compile_cache_dir={value!r}: expected a local directory path or null (off)")
    if "://" in value:
        raise ValueError(
            f"runtime.compile_cache_dir={value!r}: XLA's compilation cache is a local directory on each VM, not a URL"
        )
    path = os.path.abspath(os.path.expanduser(value))
    subdir = cfg.compile_cache_subdir
    if subdir is not None:  # a slot's own cache (sweeps/launchers/slots.py): processes on one VM never share its files
        if not isinstance(subdir, str) or not subdir.strip() or "/" in subdir or subdir in (".", ".."):
            raise ValueError(f"runtime.compile_cache_subdir={subdir!r}: expected one directory name, or null")
        path = os.path.join(path, subdir)
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as err:
            raise ValueError(f"runtime.compile_cache_dir={value!r}: cannot create {path}: {err}") from err
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"runtime.compile_cache_dir={value!r}: {path} is not a writable directory")
    return path


def _init_xla(cfg: RuntimeConfig) -> Runtime:
    from trm.runtime import xla  # imports torch_xla: only on this path (an optional dependency, not a cycle)

    plane = resolve_control_plane(cfg)
    cache = compile_cache_dir(cfg, create=True)
    runtime = xla.start(plane.rank, plane.world_size, cfg.expected_devices, cache)
    start_control_plane(plane, cfg)
    return runtime


def init_runtime(cfg: RuntimeConfig) -> Runtime:
    """Pick and start the runtime from config (`runtime.backend`) and the environment (torchrun's vars,
    or the TPU VM's for `xla`)."""
    backend: str = cfg.backend
    device_choice = cfg.device
    if backend == "auto" and xla_available():
        backend = "xla"
    if backend == "xla":
        check_device_choice(device_choice)  # XLA picks its own devices, but a typo is still refused
        return _init_xla(cfg)
    compile_cache_dir(cfg, create=False)  # only XLA has one: ignored here, but a bad value is still refused
    plane = resolve_control_plane(cfg)  # torchrun's env, or a TPU VM's (tpu_pod launcher with backend torch)
    if backend == "auto":
        backend = "torch" if plane.world_size > 1 else "single"
    if backend == "single":
        if plane.world_size > 1:
            raise ValueError(
                f"runtime.backend=single but the job has {plane.world_size} processes ({plane.source}): use runtime.backend=torch or auto"
            )
        return Runtime(device=_start_device(resolve_device(device_choice, 1, os.environ)))
    device = _start_device(resolve_device(device_choice, plane.world_size, os.environ))
    start_control_plane(plane, cfg)
    return Runtime(
        backend="torch",
        rank=plane.rank,
        world_size=plane.world_size,
        device=device,
        data_group=start_data_plane(device, plane.world_size, cfg),
    )


def _start_device(device: torch.device) -> torch.device:
    """Make a GPU this process's current one, so that kernels and NCCL land on it and not on GPU 0."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device
