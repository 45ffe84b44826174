"""Which torch device a `single` or `torch` job trains on: `runtime.device` = auto | cpu | cuda.

`auto` takes the GPU when torch sees one (a slot's CUDA_VISIBLE_DEVICES decides which: sweeps/launchers/slots.py), the
CPU otherwise, so the same study config runs on a laptop and on a GPU box. With several processes per job
(torchrun), process `LOCAL_RANK` takes visible GPU `LOCAL_RANK`: one GPU per process, as DDP expects. The `xla`
backend picks its devices itself (trm/runtime/xla.py) and ignores this key. Used by trm/runtime/__init__.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from contracts.choices import check_device_choice

if TYPE_CHECKING:
    import torch


def resolve_device(choice: str, world_size: int, env: Mapping[str, str]) -> torch.device:
    """The device for this process, or a ValueError naming the key, the value and what would work.
    `world_size` (every node's processes) only names the job in the error; the node's own count decides."""
    import torch

    check_device_choice(choice)
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError(
            "runtime.device=cuda but torch sees no GPU (torch.cuda.is_available() is False; "
            f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}): use runtime.device=auto or cpu"
        )
    # torchrun sets both; a job started one process per machine (a pod-style launcher) sets neither.
    local_rank = int(env.get("LOCAL_RANK", "0"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    if local_world > count or local_rank >= count:
        raise ValueError(
            f"runtime.device={choice}: {max(local_world, local_rank + 1)} processes on this machine (of "
            f"{world_size} in the job) but {count} visible GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}); one GPU per process: start "
            f"{count} process(es) per node, or use runtime.device=cpu"
        )
    return torch.device("cuda", local_rank)
