"""Compile once per shape: `runtime.compile_cache_dir` persists XLA's compilation cache across processes (trials),
and a trial that differs from an earlier one only in searched hyperparameters (lr, weight decay, betas, EMA
decay, puzzle-embedding lr, halting exploration) traces the same graphs, so it finds every one of them in the
cache: zero persistent-cache misses.

On XLA's CPU client a found entry cannot be loaded (PJRT CPU: "Deserializing serialized executable not
supported", counted as PersistentCacheDeserializeFailure) and is compiled again; on TPU it is a
PersistentCacheHit. What this lane checks is therefore the part that is ours: the graph (the cache key) is the
same. A run with another batch shape misses, so the check can fail."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from _lane import ROOT, WORKER, run_python, xla_env
from omegaconf import OmegaConf

from trm.losses import METRIC_KEYS
from trm.runtime import compile_cache_dir, init_runtime

LM, QH = METRIC_KEYS.index("lm_loss"), METRIC_KEYS.index("q_halt_loss")
DEVICES = 2
COMMON = ["--steps", "3", "--ema", "runtime.backend=xla", "train.grad_clip=1.0"]
FIRST = ["--exploration", "0.3"]  # _worker.py's TINY: lr 1.1e-3, betas (0.9, 0.95), EMA decay 0.9
# Every searched value another (trm/optim.py, trm/adam_atan2.py: graph_scalars); same shapes.
SECOND = [
    "--exploration",
    "0.2",
    "optim.lr=2.3e-3",
    "optim.weight_decay=0.37",
    "optim.betas=[0.9,0.99]",
    "optim.ema_decay=0.95",
    "optim.puzzle_emb_lr=3.1e-3",
    "optim.puzzle_emb_weight_decay=0.5",
]
OTHER_SHAPE = ["--exploration", "0.3", "train.global_batch_size=8"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("compile_cache")
    cache = root / "xla-cache"

    def one(name: str, args: list[str]) -> dict:
        out = root / f"{name}.pt"
        cmd = [str(WORKER), str(out), *COMMON, f"runtime.compile_cache_dir={cache}", *args]
        proc = run_python(cmd, xla_env(DEVICES))
        assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-4000:]}"
        return torch.load(out, weights_only=False)["info"]

    results = {}  # one after the other: each reads what the earlier ones wrote
    for name, args in (("first", FIRST), ("second", SECOND), ("other_shape", OTHER_SHAPE)):
        results[name] = one(name, args)
    results["cache_files"] = {"count": len(list(cache.iterdir()))}
    return results


def final(run: dict) -> dict[str, float]:
    return run["records"][-1]["counters"]


def test_second_trial_with_other_hyperparameters_compiles_nothing_new(runs: dict) -> None:
    first, second = final(runs["first"]), final(runs["second"])
    first_s, second_s = runs["first"]["records"][0]["seconds"], runs["second"]["records"][0]["seconds"]
    print(
        f"\nfirst step: run 1 (cold cache) {first_s:.2f} s, run 2 (warm cache) {second_s:.2f} s; "
        f"run 1 {first}; run 2 {second}"
    )
    # Run 1 compiled every graph and wrote each to the cache.
    assert first["UncachedCompile"] >= 1
    assert first["PersistentCacheMiss"] == first["UncachedCompile"]
    assert runs["cache_files"]["count"] >= first["UncachedCompile"]
    # Run 2: every graph it ran was already in the cache (a hit on TPU; found but not loadable on XLA's CPU client).
    assert second["PersistentCacheMiss"] == 0, second
    found = second["PersistentCacheHit"] + second["PersistentCacheDeserializeFailure"]
    assert found == first["PersistentCacheMiss"], (first, second)
    for run in (runs["first"], runs["second"]):
        losses = [r["metrics"][i] for r in run["records"] for i in (LM, QH)]
        assert all(math.isfinite(x) for x in losses), losses
    # Another lr really trained differently (the values reached the step as data).
    lm = [[r["metrics"][LM] for r in runs[name]["records"]] for name in ("first", "second")]
    assert lm[0] != lm[1]


def test_another_shape_misses_the_cache(runs: dict) -> None:
    """The control: the counters do see a new graph."""
    assert final(runs["other_shape"])["PersistentCacheMiss"] >= 1


@pytest.mark.parametrize("value", ["gs://bucket/xla-cache", "", "  ", 3, ["a"]])
def test_a_bad_cache_dir_is_refused(value: object, tmp_path: Path) -> None:
    cfg = OmegaConf.create({"backend": "single", "compile_cache_dir": value})
    with pytest.raises(ValueError, match="runtime.compile_cache_dir"):
        compile_cache_dir(cfg, create=True)
    with pytest.raises(ValueError, match="runtime.compile_cache_dir"):
        init_runtime(cfg)  # refused on every backend, though only XLA uses it


def test_the_cache_dir_is_ignored_off_xla_and_made_on_xla(tmp_path: Path) -> None:
    cache = tmp_path / "a" / "cache"
    runtime = init_runtime(OmegaConf.create({"backend": "single", "compile_cache_dir": str(cache)}))
    assert runtime.backend == "single" and not cache.exists()  # nothing made, no error
    assert compile_cache_dir(OmegaConf.create({"compile_cache_dir": None}), create=True) is None
    assert compile_cache_dir(OmegaConf.create({"compile_cache_dir": str(cache)}), create=True) == str(cache)
    assert cache.is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot create"):
        compile_cache_dir(OmegaConf.create({"compile_cache_dir": str(blocker / "sub")}), create=True)


def test_the_pod_site_sets_a_relative_per_vm_cache_dir() -> None:
    from omegaconf import DictConfig

    pod = OmegaConf.load(ROOT / "conf" / "site" / "pod.yaml")
    assert isinstance(pod, DictConfig)
    overrides = [o for o in pod.trial.overrides if str(o).startswith("runtime.compile_cache_dir=")]
    assert overrides == ["runtime.compile_cache_dir=cache/xla-compile"]
