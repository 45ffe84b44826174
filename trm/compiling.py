"""`train.compile`: what torch.compile wraps, off XLA (XLA compiles the whole step anyway).

- `net`: the recursed network only (RecursiveNet.compile(), in place): the shorter cold compile and no recompile
  when a curriculum changes H/L cycles; the recursion loop and the ACT head stay eager.
- `model`: the whole ACTModel (Module.compile(), in place, so checkpoint keys do not change): the faster step,
  the longer cold compile and one recompile per curriculum stage; for long trials.
`true`/`false` are accepted (true = `net`, false = `off`). Measured: docs/benchmarks.md#trainer-vs-the-reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trm.model import ACTModel


def apply_compile(model: ACTModel, mode: str) -> None:
    """Compile `model` in place as `mode` says (see the module docstring for which to choose)."""
    if mode == "net":
        model.inner.net.compile()
    elif mode == "model":
        model.compile()
