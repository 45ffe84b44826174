"""The TRM reference's side of bench/trainer/vs_reference.py: its worker process (bench/trainer/_reference_worker.py,
under the reference's own interpreter), a runner whose step runs there, and its config built from our arch preset,
starting from the same weights as ours.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from bench._common import StepRunner
from trm.model import TRMConfig
from trm.optim import lr_multiplier
from trm.reference_weights import load_reference_state


class ReferenceWorker:
    """The reference's process (bench/trainer/_reference_worker.py): one JSON request, one JSON reply."""

    def __init__(self, ref: Path, python: str, threads: int, device: str) -> None:
        worker = Path(__file__).resolve().parent / "_reference_worker.py"
        self.proc = subprocess.Popen(
            [python, str(worker), str(ref), str(threads), device],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, **msg: Any) -> dict[str, Any]:
        stdin, stdout = self._pipes()
        stdin.write(json.dumps(msg) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the reference worker exited ({self.proc.wait()}); its stderr is above")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def close(self) -> None:
        stdin, _ = self._pipes()
        if self.proc.poll() is None:
            stdin.write(json.dumps({"op": "quit"}) + "\n")
            stdin.close()
        self.proc.wait(timeout=60)

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout


@dataclass
class ReferenceRunner:
    """A StepRunner look-alike (for warm_up / measure) whose step runs in the reference's worker."""

    name: str
    worker: ReferenceWorker
    times: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    first_step_s: float | None = None
    first_lm_loss: float | None = None
    error: str | None = None
    lm_loss: float | None = None  # the last step's mean lm_loss

    def step(self) -> float:
        reply = self.worker.call(op="step", name=self.name)
        self.lm_loss = reply["lm_loss"]
        if self.first_step_s is None:
            self.first_step_s, self.first_lm_loss = reply["seconds"], reply["lm_loss"]
        return float(reply["seconds"])


def reference_config(arch: TRMConfig, batch: int, exploration: float, forward_dtype: str) -> dict[str, Any]:
    """The reference's TinyRecursiveReasoningModel_ACTV1Config for our arch (tests/test_fidelity.py's mapping
    read the other way; H_layers is ignored by the reference, no_ACT_continue is its Sudoku default)."""
    return {
        "batch_size": batch,
        "seq_len": arch.seq_len,
        "vocab_size": arch.vocab_size,
        "num_puzzle_identifiers": arch.num_puzzle_identifiers,
        "puzzle_emb_ndim": arch.puzzle_emb_ndim or arch.hidden_size,
        "puzzle_emb_len": arch.puzzle_emb_len,
        "H_cycles": arch.H_cycles,
        "L_cycles": arch.L_cycles,
        "H_layers": 0,
        "L_layers": arch.L_layers,
        "hidden_size": arch.hidden_size,
        "expansion": arch.expansion,
        "num_heads": arch.num_heads,
        "pos_encodings": arch.pos_encodings,
        "mlp_t": arch.mixer == "mlp_t",
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "halt_max_steps": arch.halt_max_steps,
        "halt_exploration_prob": exploration,
        "forward_dtype": forward_dtype,
        "no_ACT_continue": True,
        "causal": False,
    }


def build_reference(
    worker: ReferenceWorker,
    name: str,
    ours: StepRunner,
    arch: TRMConfig,
    compiled: bool,
    forward_dtype: str,
    state_path: Path,
) -> ReferenceRunner:
    """The reference's runner for `ours`'s config and batch (torch.compile'd when `compiled`), from the same
    weights: the first build saves the reference's initial state to state_path, later ones load it; `ours`
    loads it too (trm.reference_weights)."""
    cfg = ours.cfg
    lr_scale = lr_multiplier(0, cfg.optim.warmup_steps, cfg.train.steps, cfg.optim.lr_min_ratio)
    worker.call(
        op="build",
        name=name,
        config=reference_config(arch, ours.batch_size, float(cfg.halting.exploration_prob), forward_dtype),
        optim={k: cfg.optim[k] for k in ("lr", "weight_decay", "puzzle_emb_weight_decay")}
        | {"betas": list(cfg.optim.betas)},
        lrs=[cfg.optim.puzzle_emb_lr * lr_scale, cfg.optim.lr * lr_scale],
        batch={k: v.tolist() for k, v in ours.batch.items()},
        compile=compiled,
        seed=0,
        **({"load_state": str(state_path)} if state_path.exists() else {"save_state": str(state_path)}),
    )
    load_same_start(ours, state_path)
    return ReferenceRunner(name, worker)


def load_same_start(ours: StepRunner, state_path: Path) -> None:
    """Our runner starts from the reference's saved initial state (same weights)."""
    load_reference_state(ours.model, torch.load(state_path, map_location=ours.device))
