"""The architecture's settings (`arch.*`) and what each value means, checked before a model is built.

A value that the TRM reference also accepts means what it means there: a config copied from the reference builds
the same network here, or is refused with the difference named (docs/fidelity.md). The one default that differs,
`puzzle_emb_ndim` left out (the hidden size here; 0, no puzzle embedding, there), is there because every preset
of this project and of the reference's Sudoku runs sets the embedding to the hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class TRMConfig:
    """Architecture; one YAML per preset in conf/arch/."""

    hidden_size: int
    num_heads: int
    expansion: float
    L_layers: int
    H_cycles: int
    L_cycles: int
    mixer: str = "attention"  # "attention" (with pos_encodings) or "mlp_t" (mixes across the sequence)
    pos_encodings: str = "auto"  # "rope" | "learned" | "none" | "auto" (rope for attention, none for mlp_t)
    # Prefix positions; the puzzle embedding fills the first ones, zeros after. 0: as many as the embedding
    # needs, ceil(puzzle_emb_ndim / hidden_size), as the reference derives it (0 without a puzzle embedding).
    puzzle_emb_len: int = 16
    # Width of the puzzle embedding. None: hidden_size. 0: no puzzle embedding and no table (the reference's 0).
    puzzle_emb_ndim: int | None = None
    halt_max_steps: int = 16
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # The reference's switch for its Q-continue head. Only true is computed here: Q-halt alone, the paper's Sudoku
    # setting; false (a bootstrapped Q-continue target, a second forward per step) is refused, never ignored.
    no_ACT_continue: bool = True
    # Filled from the dataset's metadata, not from the arch preset.
    vocab_size: int = 11
    seq_len: int = 81
    num_puzzle_identifiers: int = 1

    def __post_init__(self) -> None:
        if self.mixer not in ("attention", "mlp_t"):
            raise ValueError(f"arch.mixer={self.mixer!r}: expected 'attention' or 'mlp_t'")
        if self.pos_encodings == "auto":  # a searched mixer brings its own position encoding
            self.pos_encodings = "rope" if self.mixer == "attention" else "none"
        if self.pos_encodings not in ("rope", "learned", "none"):
            raise ValueError(f"arch.pos_encodings={self.pos_encodings!r}: expected 'rope', 'learned', 'none' or 'auto'")
        if self.mixer == "attention" and self.hidden_size % self.num_heads:
            raise ValueError(f"arch.hidden_size={self.hidden_size} is not divisible by arch.num_heads={self.num_heads}")
        for key in ("H_cycles", "L_cycles", "L_layers", "halt_max_steps"):
            if getattr(self, key) < 1:
                raise ValueError(f"arch.{key}={getattr(self, key)}: must be >= 1")
        if self.no_ACT_continue is not True:
            raise ValueError(
                f"arch.no_ACT_continue={self.no_ACT_continue!r}: the reference's Q-continue head (a bootstrapped "
                "target from a second forward per step) is not implemented; only true (Q-halt alone) is accepted"
            )
        self._check_puzzle_prefix()

    def _check_puzzle_prefix(self) -> None:
        if self.puzzle_emb_ndim is not None and self.puzzle_emb_ndim < 0:
            raise ValueError(f"arch.puzzle_emb_ndim={self.puzzle_emb_ndim}: must be >= 0 (0: no puzzle embedding)")
        if self.puzzle_emb_len < 0:
            raise ValueError(f"arch.puzzle_emb_len={self.puzzle_emb_len}: must be >= 0 (0: derived from the width)")
        if self.puzzle_emb_len == 0:
            self.puzzle_emb_len = -(-self.emb_ndim // self.hidden_size)
        elif self.emb_ndim == 0:
            # The reference's prefix is the puzzle embedding itself: without one it has no prefix positions, and
            # a positive length there gives a carry longer than the input (it fails on the first step).
            raise ValueError(
                f"arch.puzzle_emb_ndim=0 (no puzzle embedding) with arch.puzzle_emb_len={self.puzzle_emb_len}: "
                "without a puzzle embedding there is no prefix (the TRM reference cannot run this either); "
                "set arch.puzzle_emb_len=0"
            )
        if self.emb_ndim > self.puzzle_emb_len * self.hidden_size:
            raise ValueError(
                f"arch.puzzle_emb_ndim={self.emb_ndim} does not fit in arch.puzzle_emb_len={self.puzzle_emb_len} "
                f"positions of arch.hidden_size={self.hidden_size}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any], **dataset_fields: int) -> TRMConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"arch has unknown keys {unknown}; accepted: {sorted(known)}")
        return cls(**{**values, **dataset_fields})

    @property
    def total_len(self) -> int:
        return self.seq_len + self.puzzle_emb_len

    @property
    def emb_ndim(self) -> int:
        """Width of the puzzle embedding; 0 when there is none."""
        return self.hidden_size if self.puzzle_emb_ndim is None else self.puzzle_emb_ndim
