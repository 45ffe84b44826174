"""Read weights written by the TRM reference code (SamsungSAILMontreal/TinyRecursiveModels) into `ACTModel`.

Why: the fidelity tests load the reference's own weights into our model and compare what both compute
(docs/fidelity.md), and a user can evaluate or fine-tune a checkpoint the reference trained. The two codes
compute the same function with other parameter names; this module is the one place that knows the mapping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor

from trm.model import ACTModel

# (reference name pattern, our name template): every persistent weight or buffer of the reference's model.
_RULES: tuple[tuple[str, str], ...] = (
    (r"inner\.embed_tokens\.embedding_weight", "inner.embed_tokens.weight"),
    (r"inner\.embed_pos\.embedding_weight", "inner.pos_emb"),
    (r"inner\.puzzle_emb\.weights", "inner.puzzle_emb.weight"),
    (r"inner\.H_init", "inner.y_init"),  # the reference's z_H is our answer state y
    (r"inner\.L_init", "inner.z_init"),  # its z_L is our latent state z
    (r"inner\.(lm_head|q_head)\.(weight|bias)", r"inner.\1.\2"),
    (r"inner\.L_level\.layers\.(\d+)\.mlp_t\.gate_up_proj\.weight", r"inner.net.blocks.\1.mix.gate_up.weight"),
    (r"inner\.L_level\.layers\.(\d+)\.mlp_t\.down_proj\.weight", r"inner.net.blocks.\1.mix.down.weight"),
    (r"inner\.L_level\.layers\.(\d+)\.self_attn\.qkv_proj\.weight", r"inner.net.blocks.\1.mix.qkv.weight"),
    (r"inner\.L_level\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"inner.net.blocks.\1.mix.out.weight"),
    (r"inner\.L_level\.layers\.(\d+)\.mlp\.gate_up_proj\.weight", r"inner.net.blocks.\1.mlp.gate_up.weight"),
    (r"inner\.L_level\.layers\.(\d+)\.mlp\.down_proj\.weight", r"inner.net.blocks.\1.mlp.down.weight"),
)
# The reference's training-time scratch (the sparse embedding's per-batch copy) and recomputed RoPE tables.
_IGNORED = re.compile(r"inner\.puzzle_emb\.local_(weights|ids)|inner\.rotary_emb\..*")
# Wrappers around the model in the reference's checkpoints: torch.compile's and the loss head's.
_WRAPPER_PREFIXES = ("_orig_mod.", "model.")


class ReferenceWeightsError(ValueError):
    pass


def our_name(reference_name: str) -> str | None:
    """Our parameter/buffer name for a reference name; None for the reference's scratch buffers."""
    name = reference_name
    while name.startswith(_WRAPPER_PREFIXES):
        name = name.split(".", 1)[1]
    if _IGNORED.fullmatch(name):
        return None
    for pattern, template in _RULES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, template, name)
    raise ReferenceWeightsError(f"reference weight {reference_name!r} has no counterpart in trm.model.ACTModel")


def load_reference_state(model: ACTModel, reference_state: Mapping[str, Tensor]) -> None:
    """Copy the reference's weights into `model`; every one of our weights and buffers must be covered."""
    ours: dict[str, Tensor] = {}
    for name, value in reference_state.items():
        mapped = our_name(name)
        if mapped is not None:
            ours[mapped] = value
    expected = model.state_dict()
    missing = sorted(set(expected) - set(ours))
    if missing:
        raise ReferenceWeightsError(f"the reference state lacks {missing}: is it the same arch (mixer, pos_encodings)?")
    for name, value in ours.items():
        if name not in expected:
            raise ReferenceWeightsError(f"reference weight for {name!r} does not exist in this arch")
        if tuple(value.shape) != tuple(expected[name].shape):
            raise ReferenceWeightsError(
                f"{name}: reference shape {tuple(value.shape)} != ours {tuple(expected[name].shape)}; "
                "set arch.* to the reference's config"
            )
    model.load_state_dict(ours)
