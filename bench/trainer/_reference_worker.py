"""The TRM reference's side of bench/trainer/vs_reference.py, in a process (and interpreter) of its own.

    REF_PYTHON bench/trainer/_reference_worker.py REF_DIR THREADS [DEVICE]     # started by the bench, never by hand

REF_DIR is a checkout of SamsungSAILMontreal/TinyRecursiveModels: its model, ACT loss head and sparse-embedding
SignSGD are imported from there (sys.path), nothing of it is copied into this project. Its optimizer, the
`adam-atan2` package, is a CUDA-only extension: the module `adam_atan2` is stood in for by trm/adam_atan2.py
(the kernel's update in plain torch, checked against the kernel's recorded updates in tests/test_fidelity.py),
registered under the name the reference imports. Besides torch the reference's model needs einops and
pydantic, which the project's venv lacks: REF_PYTHON is a venv with torch pinned to the project's version
first, then those two (docs/benchmarks.md, "Trainer vs the reference"). Only torch and trm/adam_atan2.py of
this project are imported here.

Protocol: one JSON object a line on stdin, one reply a line on the original stdout (anything the reference or
torch prints goes to stderr); a failure answers {"error": "..."}.
  {"op": "build", "name", "config", "lrs", "optim", "batch", "compile", "seed", "save_state"?, "load_state"?}
      -> {"params"}: the reference's model (config: its TinyRecursiveReasoningModel_ACTV1Config) in its
      ACTLossHead, torch.compile'd as pretrain.create_model does when "compile"; its optimizers as
      create_model builds them (SignSGD on the puzzle embedding, Adam-atan2 on the parameters).
  {"op": "step", "name"} -> {"seconds", "lm_loss"}: one step, as pretrain.train_batch runs it on one process
      (without the all-reduce): loss head forward on the kept carry, (loss / batch).backward(),
      each optimizer's lr set, step() and zero_grad(), the metrics stacked and read.
  {"op": "quit"}
DEVICE (cpu, or cuda): the model, its carry and the batch are made there as pretrain.py makes them (under a
`torch.device` context).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any, TextIO

import torch

ROOT = Path(__file__).resolve().parents[2]


class ReferenceStep:
    def __init__(self, msg: dict[str, Any], device: str) -> None:
        with torch.device(device):  # as pretrain.create_model and its train loop do with "cuda"
            self._build(msg, device)

    def _build(self, msg: dict[str, Any], device: str) -> None:
        from adam_atan2 import AdamATan2  # the stand-in registered by main()
        from models.losses import ACTLossHead
        from models.recursive_reasoning.trm import TinyRecursiveReasoningModel_ACTV1
        from models.sparse_embedding import CastedSparseEmbeddingSignSGD_Distributed

        torch.manual_seed(msg["seed"])
        model: Any = ACTLossHead(TinyRecursiveReasoningModel_ACTV1(msg["config"]), loss_type="stablemax_cross_entropy")
        if msg.get("load_state"):
            model.load_state_dict(torch.load(msg["load_state"], map_location=device))
        if msg.get("save_state"):
            torch.save(model.state_dict(), msg["save_state"])
        model.train()
        if msg["compile"]:
            model = torch.compile(model)
        optim = msg["optim"]
        self.optimizers = [
            CastedSparseEmbeddingSignSGD_Distributed(
                model.model.puzzle_emb.buffers(), lr=0, weight_decay=optim["puzzle_emb_weight_decay"], world_size=1
            ),
            # The reference passes lr=0 (its scheduler sets it each step); the stand-in refuses lr <= 0 at
            # construction, so it starts at the base lr and is set like the other below.
            AdamATan2(
                model.parameters(), lr=optim["lr"], weight_decay=optim["weight_decay"], betas=tuple(optim["betas"])
            ),
        ]
        self.lrs = msg["lrs"]
        self.model = model
        self.batch = {k: torch.tensor(v, dtype=torch.int32, device=device) for k, v in msg["batch"].items()}
        self.batch_size = self.batch["inputs"].shape[0]
        self.carry = model.initial_carry(self.batch)
        self.params = sum(p.numel() for p in model.parameters())

    def step(self) -> dict[str, float]:
        start = time.perf_counter()
        self.carry, loss, metrics, _, _ = self.model(carry=self.carry, batch=self.batch, return_keys=[])
        ((1 / self.batch_size) * loss).backward()
        for optimizer, lr in zip(self.optimizers, self.lrs):
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            optimizer.zero_grad()
        values = dict(zip(sorted(metrics), torch.stack([metrics[k] for k in sorted(metrics)]).tolist()))
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "lm_loss": values["lm_loss"] / self.batch_size}


def serve(commands: TextIO, replies: TextIO, device: str) -> None:
    steps: dict[str, ReferenceStep] = {}
    for line in commands:
        msg = json.loads(line)
        reply: dict[str, Any]
        try:
            if msg["op"] == "quit":
                return
            if msg["op"] == "build":
                steps[msg["name"]] = ReferenceStep(msg, device)
                reply = {"params": steps[msg["name"]].params}
            elif msg["op"] == "step":
                reply = steps[msg["name"]].step()
            else:
                reply = {"error": f"unknown op {msg['op']!r}"}
        except Exception as err:  # noqa: BLE001 - the error goes back to the parent as its reply
            traceback.print_exc(limit=5)
            reply = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> None:
    reference, threads = Path(sys.argv[1]).resolve(), int(sys.argv[2])
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    sys.path[:0] = [str(reference), str(ROOT)]
    from trm.adam_atan2 import AdamAtan2

    sys.modules["adam_atan2"] = stand_in = types.ModuleType("adam_atan2")
    stand_in.AdamATan2 = AdamAtan2  # type: ignore[attr-defined]
    torch.set_num_threads(threads)
    replies, sys.stdout = sys.stdout, sys.stderr
    serve(sys.stdin, replies, device)


if __name__ == "__main__":
    main()
