"""Record what the TRM reference computes with `forward_dtype: bfloat16` on this CPU (tests/fidelity/README.md).

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m tests.record_reference_bf16 REF_CHECKOUT

REF_CHECKOUT is the reference (SamsungSAILMontreal/TinyRecursiveModels at e7b6871) with einops and pydantic
importable. Its model is run on the weights and batch of tests/fidelity/trm_reference_bf16.pt, under that file's
kernel pins, and its 16 eval steps are written, in that file's layout, to
tests/fidelity/trm_reference_bf16.<cpu kind>.pt. Why per CPU: with the kernels pinned, the attention variant's bf16
bits still differ between an AMX Xeon and an AMD EPYC, for the reference as for us (docs/fidelity.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from tests.reference_fixtures import BF16_GOLDEN_PATH, bf16_recording_path, cpu_kind, step_sha256

VARIANTS = ("mlp_t", "att")


def reference_eval(model_class: Any, variant: dict[str, Any], batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The reference's 16 eval ACT steps, kept as trm_reference_bf16.pt keeps them."""
    model = model_class(dict(variant["config"]))
    model.load_state_dict(variant["state"])
    model.eval()
    carry = model.initial_carry(batch)
    steps: list[dict[str, torch.Tensor]] = []
    with torch.no_grad():
        for step in range(16):
            carry, out = model(carry=carry, batch=batch)
            steps.append(
                {"logits": out["logits"], "q_halt": out["q_halt_logits"], "halted": carry.halted, "steps": carry.steps}
            )
            if step == 0:
                z_H, z_L = carry.inner_carry.z_H, carry.inner_carry.z_L
    value_steps = variant["eval"]["value_steps"]
    return {
        "logits": torch.stack([steps[s - 1]["logits"] for s in value_steps]),
        "q_halt_logits": torch.stack([steps[s - 1]["q_halt"] for s in value_steps]),
        "halted": torch.stack([s["halted"] for s in steps]),
        "steps": torch.stack([s["steps"] for s in steps]),
        "z_H": z_H.unsqueeze(0),
        "z_L": z_L.unsqueeze(0),
        "sha256": [step_sha256(s["logits"], s["q_halt"]) for s in steps],
        "value_steps": list(value_steps),
    }


def main(ref_checkout: str) -> Path:
    golden = torch.load(BF16_GOLDEN_PATH, weights_only=False)
    unpinned = {k: v for k, v in golden["kernels"].items() if v is not None and os.environ.get(k) != v}
    if unpinned:
        raise SystemExit(
            f"set the kernel pins the recording is made with: {' '.join(f'{k}={v}' for k, v in unpinned.items())}"
        )
    sys.path.insert(0, str(Path(ref_checkout).resolve()))
    from models.recursive_reasoning.trm import TinyRecursiveReasoningModel_ACTV1  # the reference's own model

    recording = {
        "cpu_kind": cpu_kind(),
        "torch": torch.__version__,
        "reference_commit": golden["reference_commit"],
        "kernels": golden["kernels"],
        **{
            name: {"eval": reference_eval(TinyRecursiveReasoningModel_ACTV1, golden[name], golden["batch"])}
            for name in VARIANTS
        },
    }
    out = bf16_recording_path(recording["cpu_kind"])
    torch.save(recording, out)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1]))
