"""The TRM reference's recorded configs, weights and batches as our model and inputs (tests/fidelity/README.md).

Also runnable: `python -m tests.reference_fixtures GOLDEN OUT` runs the bf16_reference eval forward of every
variant in GOLDEN and saves its outputs to OUT. tests/test_fidelity.py runs it in a fresh process whose CPU
kernels are pinned to the ones the reference ran on when it was recorded (bf16 GEMMs of another ISA round
differently, so bits can only be compared kernel for kernel).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import torch

from trm.model import ACTModel, TRMConfig
from trm.reference_weights import load_reference_state

# Environment variables that choose torch's CPU kernels: the golden bf16 file says which values it was recorded
# with, and the forward that is compared with it runs with the same.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")

FIDELITY = Path(__file__).parent / "fidelity"
BF16_GOLDEN_PATH = FIDELITY / "trm_reference_bf16.pt"  # weights, batch, kernel pins, and the eval of its CPU kind
BF16_GOLDEN_CPU_KIND = "intel-amx"  # where trm_reference_bf16.pt was recorded: an Intel Xeon with amx_bf16


def cpu_kind() -> str:
    """The CPU kind a bf16 recording holds for (its vendor and bf16 units): with the kernels pinned, the attention
    variant's bf16 bits still differ between kinds, for the reference as for us (docs/fidelity.md)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in info.splitlines())}
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(fields.get("vendor_id", ""), "other")
    flags = set(fields.get("flags", "").split())
    units = "amx" if "amx_bf16" in flags else "avx512bf16" if "avx512_bf16" in flags else "nobf16"
    return f"{vendor}-{units}"


def step_sha256(logits: torch.Tensor, q_halt: torch.Tensor) -> str:
    """The bits of one eval step: its bf16 logits and fp32 Q-halt logits (as the recordings hash them)."""
    data = logits.contiguous().view(torch.int16).numpy().tobytes() + q_halt.contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def bf16_recording_path(kind: str) -> Path:
    """The file holding the reference's bf16 eval recorded on a CPU of `kind`."""
    return BF16_GOLDEN_PATH if kind == BF16_GOLDEN_CPU_KIND else FIDELITY / f"trm_reference_bf16.{kind}.pt"


def our_config(ref: dict[str, Any]) -> TRMConfig:
    """The reference's arch config as ours (it must be one our model computes: no Q-continue, non-causal)."""
    assert ref["no_ACT_continue"] and not ref["causal"]
    return TRMConfig(
        hidden_size=ref["hidden_size"],
        num_heads=ref["num_heads"],
        expansion=ref["expansion"],
        L_layers=ref["L_layers"],
        H_cycles=ref["H_cycles"],
        L_cycles=ref["L_cycles"],
        mixer="mlp_t" if ref["mlp_t"] else "attention",
        pos_encodings=ref["pos_encodings"],
        puzzle_emb_len=ref["puzzle_emb_len"],
        puzzle_emb_ndim=ref["puzzle_emb_ndim"],
        halt_max_steps=ref["halt_max_steps"],
        rms_norm_eps=ref["rms_norm_eps"],
        rope_theta=ref["rope_theta"],
        vocab_size=ref["vocab_size"],
        seq_len=ref["seq_len"],
        num_puzzle_identifiers=ref["num_puzzle_identifiers"],
    )


def reference_model(config: dict[str, Any], state: dict[str, torch.Tensor]) -> ACTModel:
    """Our model with the reference's config and weights."""
    model = ACTModel(our_config(config))
    load_reference_state(model, state)
    return model


def reference_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value.long() for key, value in batch.items()}


def bf16_reference_eval(golden: dict[str, Any], name: str) -> dict[str, torch.Tensor]:
    """16 eval ACT steps of our model under train.precision=bf16_reference: every step's logits and Q-halt
    logits, the halting, and the carry after step 1."""
    from trm.step import autocast, carry_dtype

    variant = golden[name]
    model = reference_model(variant["config"], variant["state"]).eval()
    batch = reference_batch(golden["batch"])
    carry = model.initial_carry(batch, carry_dtype("bf16_reference"))
    out: dict[str, list[torch.Tensor]] = {"logits": [], "q_halt_logits": [], "halted": [], "steps": []}
    with torch.no_grad():
        for step in range(16):
            with autocast("bf16_reference", torch.device("cpu")):
                carry, logits, q_halt = model(carry, batch)
            for key, value in zip(out, (logits, q_halt, carry.halted, carry.steps)):
                out[key].append(value)
            if step == 0:
                out["z_H"], out["z_L"] = [carry.y], [carry.z]
    return {key: torch.stack(values) for key, values in out.items()}


if __name__ == "__main__":
    golden_file, out_file = sys.argv[1:3]
    recorded = torch.load(golden_file, weights_only=False)
    torch.save({name: bf16_reference_eval(recorded, name) for name in ("mlp_t", "att")}, out_file)
