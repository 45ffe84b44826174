"""Compile once per shape: `runtime.compile_cache_dir` persists XLA's compilation cache across processes (trials),
and a trial that differs from an earlier one only in searched hyperparameters (lr, weight decay, betas, EMA
decay, puzzle-embedding lr, halting exploration) traces the same graphs, so it finds every one of them in the
cache: zero persistent-cache misses. With Adam-atan2 (the default), and with AdamW and Lion (trm/xla_optim.py),
a weight decay of exactly 0 included.

On XLA's CPU client a found entry cannot be loaded (PJRT CPU: "Deserializing serialized executable not
supported", counted as PersistentCacheDeserializeFailure) and is compiled again; on TPU it is a
PersistentCacheHit. What this lane checks is therefore the part that is ours: the graph (the cache key) is the
same. A run with another batch shape misses, so the check can fail."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from _lane import ROOT, WORKER, run_python, xla_env
from omegaconf import OmegaConf

from tests.config_blocks import runtime_config
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
# AdamW and Lion (trm/xla_optim.py), each a pair of trials on its own cache, 1 device: the first with a weight decay
# of exactly 0 (lr 1.1e-3 from TINY, the betas of its conf/optim/*.yaml), the second with another lr, a non-zero
# weight decay and other betas (AdamW: the betas that coincided as Python floats, and another eps). Before
# trm/xla_optim.py, each of a zero weight decay and AdamW's betas [0.9,0.99] was another graph (docs/benchmarks.md).
OPTIMIZER_TRIALS = {
    "adamw": {
        "zero_weight_decay": ["optim=adamw", "optim.weight_decay=0"],
        "other_values": [
            "optim=adamw",
            "optim.lr=2.3e-3",
            "optim.weight_decay=0.37",
            "optim.betas=[0.9,0.99]",
            "optim.eps=1e-6",
        ],
    },
    "lion": {
        "zero_weight_decay": ["optim=lion", "optim.weight_decay=0"],
        "other_values": ["optim=lion", "optim.lr=7e-5", "optim.weight_decay=0.37", "optim.betas=[0.95,0.98]"],
    },
}


def trial(root: Path, cache: Path, name: str, args: list[str], devices: int) -> dict:
    out = root / f"{name}.pt"
    cmd = [str(WORKER), str(out), *COMMON, f"runtime.compile_cache_dir={cache}", *args]
    proc = run_python(cmd, xla_env(devices))
    assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-4000:]}"
    return torch.load(out, weights_only=False)["info"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("compile_cache")
    cache = root / "xla-cache"
    results = {}  # one after the other: each reads what the earlier ones wrote
    for name, args in (("first", FIRST), ("second", SECOND), ("other_shape", OTHER_SHAPE)):
        results[name] = trial(root, cache, name, args, DEVICES)
    results["cache_files"] = {"count": len(list(cache.iterdir()))}
    return results


@pytest.fixture(scope="module")
def optimizer_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    root = tmp_path_factory.mktemp("compile_cache_optimizers")

    def pair(optimizer: str) -> dict[str, dict]:  # one after the other, on this optimizer's cache
        cache = root / f"{optimizer}-cache"
        return {
            name: trial(root, cache, f"{optimizer}-{name}", ["--exploration", "0.3", *args], 1)
            for name, args in OPTIMIZER_TRIALS[optimizer].items()
        }

    with ThreadPoolExecutor(max_workers=2) as pool:  # the two pairs side by side
        futures = {optimizer: pool.submit(pair, optimizer) for optimizer in OPTIMIZER_TRIALS}
        return {optimizer: future.result() for optimizer, future in futures.items()}


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


@pytest.mark.parametrize("optimizer", list(OPTIMIZER_TRIALS))
def test_adamw_and_lion_trials_with_other_values_compile_nothing_new(optimizer: str, optimizer_runs: dict) -> None:
    trials = optimizer_runs[optimizer]
    first, second = (final(trials[name]) for name in ("zero_weight_decay", "other_values"))
    print(f"\n{optimizer}: weight decay 0 {first}; then other values {second}")
    assert first["UncachedCompile"] >= 1 and first["PersistentCacheMiss"] == first["UncachedCompile"], first
    assert second["PersistentCacheMiss"] == 0, second  # another lr, weight decay (0 -> not 0) and betas: no new graph
    assert second["LocalScalarDense"] == 0, second  # and no scalar read back to the host
    lm = [[r["metrics"][LM] for r in trials[name]["records"]] for name in ("zero_weight_decay", "other_values")]
    assert lm[0] != lm[1]  # the values reached the step as data


def test_another_shape_misses_the_cache(runs: dict) -> None:
    """The control: the counters do see a new graph."""
    assert final(runs["other_shape"])["PersistentCacheMiss"] >= 1


@pytest.mark.parametrize("value", ["gs://bucket/xla-cache", "", "  ", 3, ["a"]])
def test_a_bad_cache_dir_is_refused(value: object, tmp_path: Path) -> None:
    cfg = runtime_config(backend="single", compile_cache_dir=value)
    with pytest.raises(ValueError, match="runtime.compile_cache_dir"):
        compile_cache_dir(cfg, create=True)
    with pytest.raises(ValueError, match="runtime.compile_cache_dir"):
        init_runtime(cfg)  # refused on every backend, though only XLA uses it


def test_the_cache_dir_is_ignored_off_xla_and_made_on_xla(tmp_path: Path) -> None:
    cache = tmp_path / "a" / "cache"
    runtime = init_runtime(runtime_config(backend="single", compile_cache_dir=str(cache)))
    assert runtime.backend == "single" and not cache.exists()  # nothing made, no error
    assert compile_cache_dir(runtime_config(compile_cache_dir=None), create=True) is None
    assert compile_cache_dir(runtime_config(compile_cache_dir=str(cache)), create=True) == str(cache)
    assert cache.is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot create"):
        compile_cache_dir(runtime_config(compile_cache_dir=str(blocker / "sub")), create=True)


def test_the_pod_site_sets_a_relative_per_vm_cache_dir() -> None:
    from omegaconf import DictConfig

    pod = OmegaConf.load(ROOT / "conf" / "site" / "pod.yaml")
    assert isinstance(pod, DictConfig)
    overrides = [o for o in pod.trial.overrides if str(o).startswith("runtime.compile_cache_dir=")]
    assert overrides == ["runtime.compile_cache_dir=cache/xla-compile"]
