"""A whole `python -m trm.train` run on the xla backend (SPMD over 4 virtual CPU devices) against the same run
on the CPU (`single`): same train/eval metrics at every log and eval point, checkpoints written and loadable,
and a run stopped at step 6 and resumed in a new process continues with the same numbers."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _lane import run_python, xla_env

from contracts.metrics_log import WALL_TIME_KEY, read_metrics

# tests/test_train.py's small run, made deterministic (no exploration: XLA's RNG is not the CPU's).
FAST = [
    "experiment=test_tiny",
    "train.log_interval=3",
    "train.eval_interval=6",
    "train.steps=12",
    "halting.exploration_prob=0.0",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("xla_train_run")
    data = root / "data"
    devices = {"single": None, "xla": 4}

    def one(backend: str, name: str, *extra: str) -> Path:
        out = root / name
        args = [
            "-m",
            "trm.train",
            *FAST,
            f"data.root={data}",
            f"out_dir={out}",
            f"hydra.run.dir={out}/hydra",
            f"runtime.backend={backend}",
            *extra,
        ]
        if backend == "xla":
            args.append("runtime.expected_devices=4")
        proc = run_python(args, xla_env(devices[backend]))
        assert proc.returncode == 0, f"{name} run failed:\n{proc.stderr[-4000:]}"
        return out

    runs = {"single": one("single", "single")}  # generates the dataset; the other runs read the same files
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores
        straight = pool.submit(one, "xla", "xla")
        one("xla", "resumed", "train.stop_after=6")  # stops with a checkpoint at step 6 ...
        runs["resumed"] = one("xla", "resumed")  # ... and a new process resumes it to step 12
        runs["xla"] = straight.result()
    return runs


def test_xla_run_matches_cpu_run(runs: dict[str, Path]) -> None:
    cpu, xla = read_metrics(runs["single"]), read_metrics(runs["xla"])
    assert [r["step"] for r in xla] == [r["step"] for r in cpu] == [3, 6, 6, 9, 12, 12]
    for a, b in zip(xla, cpu):
        assert a.keys() == b.keys()
        for key, value in b.items():
            if key != WALL_TIME_KEY:  # when each record was written: not a result
                assert a[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (a["step"], key)
    evals = [r for r in xla if "eval/halted_examples" in r]
    assert evals and all(r["eval/halted_examples"] == 32 for r in evals)  # every eval example once: no double count


def test_xla_run_summary_and_checkpoint(runs: dict[str, Path]) -> None:
    summary = json.loads((runs["xla"] / "summary.json").read_text())
    assert summary["outcome"] == "COMPLETE" and summary["steps"] == 12
    # The step speed counts the mesh's devices, not the processes: batch 16 over 4 devices (one process), timed
    # from the first log point (3) on (trm/measures/throughput.py); the CPU run spreads it over its one process.
    speed, single = summary["throughput"], json.loads((runs["single"] / "summary.json").read_text())["throughput"]
    assert (speed["steps"], speed["devices"], speed["examples_per_device"]) == (9, 4, 4.0)
    assert (single["steps"], single["devices"], single["examples_per_device"]) == (9, 1, 16.0)
    assert speed["flops_per_s"] == pytest.approx(summary["flops_per_sample_step"] * 16 * 9 / speed["seconds"])
    # The checkpoint opens in a process that never imports torch_xla (analysis, a CPU resume).
    check = (
        "import torch; from trm.checkpoints import checkpoint; "
        f"s = checkpoint.load({str(runs['xla'] / 'checkpoints')!r}); "
        "assert s['step'] == 12, s['step']; "
        "devs = {t.device.type for t in s['model'].values()}; assert devs == {'cpu'}, devs; "
        # SPMD: the global carry (the whole batch of 16) saved once beside the ranks' RNG states, not per rank.
        "assert [set(r) for r in s['ranks']] == [{'rng'}], s['ranks']; "
        "assert s['carry']['y'].shape[0] == 16 and s['carry']['y'].device.type == 'cpu'; print('ok')"
    )
    env = xla_env()
    env.pop("PJRT_DEVICE")
    proc = run_python(["-c", check], env)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_xla_run_resumes_from_its_checkpoint(runs: dict[str, Path]) -> None:
    straight, resumed = read_metrics(runs["xla"]), read_metrics(runs["resumed"])
    assert [r["step"] for r in resumed] == [r["step"] for r in straight]  # 3, 6 (+eval), then 9, 12 (+eval)
    for a, b in zip(resumed, straight):
        for key, value in b.items():
            assert a[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (a["step"], key)
