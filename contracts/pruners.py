"""The pruners a study may build, in the driver and in each job (which rebuilds the stored spec): Optuna's, and the
project's own rules in contracts/pruning/ (the evidence wrapper, the headroom rule). Here, in the layer both the
platform and the trainer import: a new rule is its module in contracts/pruning/ and its conf/pruner/ file, and
nothing here changes.
"""

from __future__ import annotations

from typing import Any

EVIDENCE_PRUNER = "contracts.pruning.evidence.EvidencePruner"
# Hydra's instantiate allowlist (`_execution_whitelist_`, trailing `.*`: anything under the package) for a pruner
# spec, stored or configured.
PRUNER_TARGETS = ["optuna.pruners.*", "contracts.pruning.*"]
# The wrapper's earlier homes, as studies stored before each move name it: read as where it lives now.
MOVED_PRUNER_TARGETS = {
    "sweeps.pruning_evidence.EvidencePruner": EVIDENCE_PRUNER,
    "contracts.pruning_evidence.EvidencePruner": EVIDENCE_PRUNER,
}


def current_pruner_spec(spec: Any) -> Any:
    """A stored pruner `_target_` dict (a study's StudyAttrs.pruner, or the pruner in its definition) with a moved
    class named where it lives now, in the spec and in a wrapped one; anything else as it is. A copy: the stored value
    is never changed, and a study recorded before the move is still the same study."""
    if not isinstance(spec, dict):
        return spec
    out = {k: current_pruner_spec(v) if k == "wrapped" else v for k, v in spec.items()}
    if out.get("_target_") in MOVED_PRUNER_TARGETS:
        out["_target_"] = MOVED_PRUNER_TARGETS[out["_target_"]]
    return out
