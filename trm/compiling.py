"""`train.compile`: what torch.compile wraps, off XLA (XLA compiles the whole step anyway).

Two choices with a real trade-off, measured on an AVX2 EPYC (docs/benchmarks.md, "Trainer vs the reference"):
- `net`: the recursed network only (RecursiveNet.compile(), in place). Cold compile 30-81 s, no recompile when
  a curriculum changes H/L cycles, but the recursion loop and the ACT head stay eager: 0.77x (fp32) / 0.83x
  (bf16) the reference's compiled samples/s for MLP-t (under load).
- `model`: the whole ACTModel (Module.compile(), in place, so checkpoint keys do not change). On par with the
  reference's compiled step (MLP-t fp32 1.01x quiet, 9 rounds; 1.07x under load), but a cold compile of 51-286 s
  and one recompile per curriculum stage: worth it for long trials (the paper's 65k steps), not for a laptop
  study's 5-minute ones.
`true`/`false` are still accepted (true = `net`, what `train.compile=true` did before the choice existed).
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
