"""train.precision=auto (trm/precision.py): bf16 where the device has bf16 units, fp32 elsewhere; an explicit
precision wins; a real run records the choice and its reason; a checkpoint never silently changes precision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import contracts.choices
import trm.precision
from contracts.hydra_app import TrainJob, compose_train_config, to_dict
from tests.wandb_offline import find_runs, read_offline_run
from trm.checkpoints import checkpoint
from trm.fingerprint import training_identity
from trm.precision import DeviceFacts, device_facts, read_cpu_flags, resolve_precision
from trm.step import PRECISIONS, carry_dtype
from trm.train import run

AVX2 = frozenset(["fpu", "sse", "sse2", "avx", "fma", "avx2", "bmi2"])  # the AMD EPYC where bf16 was ~20x slower
AVX512_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512_bf16"}  # the one where a bf16 matmul ran 7.8x faster
AMX = AVX2 | {"avx512f", "amx_tile", "amx_bf16", "amx_int8"}  # Sapphire Rapids

TABLE = [  # (facts, bf16_mode, mode, words in the reason)
    (DeviceFacts("cpu", cpu_flags=AVX2), "bf16", "fp32", "no bf16 units"),
    (DeviceFacts("cpu", cpu_flags=AVX2), "bf16_reference", "fp32", "no bf16 units"),
    (DeviceFacts("cpu", cpu_flags=AVX512_BF16), "bf16", "bf16", "avx512_bf16"),
    (DeviceFacts("cpu", cpu_flags=AVX512_BF16), "bf16_reference", "bf16_reference", "avx512_bf16"),
    (DeviceFacts("cpu", cpu_flags=AMX), "bf16", "bf16", "amx_bf16"),
    (DeviceFacts("cpu", cpu_flags=None), "bf16", "fp32", "CPU flags unknown"),
    (DeviceFacts("cuda", cuda_capability=(8, 0)), "bf16", "bf16", "8.0 >= 8.0"),
    (DeviceFacts("cuda", cuda_capability=(9, 0)), "bf16_reference", "bf16_reference", "9.0 >= 8.0"),
    (DeviceFacts("cuda", cuda_capability=(7, 5)), "bf16", "fp32", "no bf16 units: CUDA compute capability 7.5 < 8.0"),
    (DeviceFacts("cuda"), "bf16", "fp32", "unknown"),
    (DeviceFacts("xla", xla_hardware="TPU"), "bf16", "bf16", "TPU"),
    (DeviceFacts("xla", xla_hardware="TPU"), "bf16_reference", "bf16_reference", "TPU"),
    (DeviceFacts("xla", cpu_flags=AVX2, xla_hardware="CPU"), "bf16", "fp32", "XLA device CPU: no bf16 units"),
    (DeviceFacts("xla", cpu_flags=AVX512_BF16, xla_hardware="CPU"), "bf16", "bf16", "avx512_bf16"),
    (DeviceFacts("xla", cuda_capability=(8, 6), xla_hardware="CUDA"), "bf16", "bf16", "XLA GPU"),
    (DeviceFacts("xla"), "bf16", "fp32", "no bf16 units known"),
    (DeviceFacts("mps"), "bf16", "fp32", "no bf16 units known for device type 'mps'"),
]


@pytest.mark.parametrize(("facts", "bf16_mode", "mode", "why"), TABLE)
def test_auto_picks_bf16_only_where_the_device_has_bf16_units(
    facts: DeviceFacts, bf16_mode: str, mode: str, why: str
) -> None:
    chosen = resolve_precision("auto", facts, bf16_mode)
    assert chosen.mode == mode
    assert chosen.reason.startswith("auto: ") and why in chosen.reason, chosen.reason


def test_an_explicit_precision_wins() -> None:
    tpu, avx2 = DeviceFacts("xla", xla_hardware="TPU"), DeviceFacts("cpu", cpu_flags=AVX2)
    assert resolve_precision("fp32", tpu, "bf16_reference") == ("fp32", "train.precision=fp32 (explicit)")
    assert resolve_precision("bf16_reference", tpu).mode == "bf16_reference"
    assert resolve_precision("bf16", DeviceFacts("cpu", cpu_flags=AVX512_BF16), "bf16_reference").mode == "bf16"
    # bf16 where there are no bf16 units: still bf16, with the warning in the reason (the start line shows it)
    slow = resolve_precision("bf16", avx2)
    assert slow.mode == "bf16"
    assert slow.reason.startswith("train.precision=bf16 (explicit); warning: no bf16 units"), slow.reason


def test_unknown_values_are_refused_with_the_key_and_the_accepted_values() -> None:
    cpu = DeviceFacts("cpu", cpu_flags=AVX2)
    with pytest.raises(
        ValueError, match=r"train.precision='fp16': expected one of \['auto', 'fp32', 'bf16', 'bf16_reference'\]"
    ):
        resolve_precision("fp16", cpu)
    with pytest.raises(ValueError, match=r"train.bf16_mode='fp32': expected one of \['bf16', 'bf16_reference'\]"):
        resolve_precision("auto", cpu, "fp32")
    with pytest.raises(ValueError, match=r"train.bf16_mode='bf61'"):  # checked even where auto is not asked for
        resolve_precision("fp32", cpu, "bf61")
    # The step runs concrete modes only: `auto` reaching it is a bug, said as such.
    assert set(PRECISIONS) == set(contracts.choices.PRECISION_MODES)
    with pytest.raises(ValueError, match=r"train.precision='auto' reached the step unresolved"):
        carry_dtype("auto")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert read_cpu_flags(x86) == {"fpu", "avx2", "avx512_bf16"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert read_cpu_flags(arm) == {"fp", "asimd", "bf16"}  # Arm's bf16 is not one of the units auto counts
    assert resolve_precision("auto", DeviceFacts("cpu", cpu_flags=read_cpu_flags(arm))).mode == "fp32"
    assert read_cpu_flags(tmp_path / "missing") is None
    assert device_facts(torch.device("cpu")) == DeviceFacts("cpu", cpu_flags=read_cpu_flags())  # this machine's


def test_the_presets() -> None:
    default = compose_train_config([]).train
    assert (default.precision, default.bf16_mode) == ("auto", "bf16")
    paper = compose_train_config(["experiment=paper_sudoku", "data.path=unused"]).train
    assert (paper.precision, paper.bf16_mode) == ("auto", "bf16_reference")
    # The paper's preset stays the reference's bf16 on a TPU and a GPU, and is fp32 on a CPU without bf16 units.
    for facts in (DeviceFacts("xla", xla_hardware="TPU"), DeviceFacts("cuda", cuda_capability=(8, 0))):
        assert resolve_precision(paper.precision, facts, paper.bf16_mode).mode == "bf16_reference"
    assert resolve_precision(paper.precision, DeviceFacts("cpu", cpu_flags=AVX2), paper.bf16_mode).mode == "fp32"


def test_the_checkpoint_identity_holds_the_resolved_mode() -> None:
    cfg = to_dict(compose_train_config([]), resolve=False)  # the config as written (TrainJob.written)
    assert training_identity(cfg)["train.precision"] == "auto"
    identity = training_identity(cfg, "bf16")
    assert identity["train.precision"] == "bf16" and "train.bf16_mode" not in identity
    explicit = to_dict(compose_train_config(["train.precision=bf16", "train.bf16_mode=bf16_reference"]), resolve=False)
    assert training_identity(explicit, "bf16") == identity  # auto and explicit: the same training


def tiny(tmp_path: Path, data_root: Path, *extra: str) -> TrainJob:
    cfg = compose_train_config(
        [
            "experiment=test_tiny",
            f"data.root={data_root}",
            f"out_dir={tmp_path}",
            "train.log_interval=2",
            "train.eval_interval=4",
            "train.steps=4",
            "train.precision=auto",
            *extra,
        ]  # fmt: skip
    )
    return TrainJob.of(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("machine", ["avx2", "this machine"])
def test_a_real_run_records_what_auto_chose_and_why(
    machine: str,
    tmp_path: Path,
    data_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """A tiny run with train.precision=auto: the AVX2 machine of the issue (its flags stand in for this CPU's)
    trains in fp32; this machine in whatever its own flags give. Start line, summary.json and the W&B run's config
    all show the mode and the reason."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)  # W&B offline: the run's config is read back from disk
    if machine == "avx2":
        monkeypatch.setattr(trm.precision, "read_cpu_flags", lambda: AVX2)
        expected = ("fp32", "auto: no bf16 units: the CPU flags lack amx_bf16 and avx512_bf16")
    else:
        mode, reason = resolve_precision("auto", DeviceFacts("cpu", cpu_flags=read_cpu_flags()))
        expected = (mode, reason)
    summary = run(tiny(tmp_path, data_root))
    assert summary.outcome == "COMPLETE"
    assert (summary.precision, summary.precision_reason) == expected
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert (saved["precision"], saved["precision_reason"]) == expected
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    start = next(line for line in lines if line.get("event") == "start")
    assert (start["precision"], start["precision_reason"]) == expected
    (wandb_run,) = find_runs(tmp_path)
    config = read_offline_run(wandb_run).config
    assert (config["train"]["precision"], config["train"]["precision_reason"]) == expected
    state = checkpoint.load(str(tmp_path / "checkpoints"))
    assert state is not None and state["identity"]["config"]["train.precision"] == expected[0]


@pytest.mark.slow
def test_a_checkpoint_does_not_silently_change_precision(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that auto made bf16 (bf16 units), resumed where auto gives fp32 (none): refused, naming the key;
    continuing it in bf16 there is one explicit override away."""
    monkeypatch.setattr(trm.precision, "read_cpu_flags", lambda: AVX512_BF16)
    assert run(tiny(tmp_path, data_root, "train.stop_after=2")).precision == "bf16"
    monkeypatch.setattr(trm.precision, "read_cpu_flags", lambda: AVX2)
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"train.precision: 'bf16' there, 'fp32' here"):
        run(tiny(tmp_path, data_root))
    summary = run(tiny(tmp_path, data_root, "train.precision=bf16"))
    assert summary.outcome == "COMPLETE" and summary.steps == 4 and summary.precision == "bf16"


@pytest.mark.slow
def test_the_trial_stores_the_precision(pg_url: str) -> None:
    import optuna

    from contracts.run_summary import RunSummary
    from storage import open_storage
    from trm.links.trial import TrialLink

    study = optuna.create_study(study_name="precision_attr", storage=open_storage(pg_url), direction="maximize")
    trial = study.ask()
    TrialLink("precision_attr", trial.number, pg_url).record_outcome(
        RunSummary(
            outcome="COMPLETE",
            best_value=0.5,
            precision="fp32",
            precision_reason="auto: no bf16 units: ...",
            device="cuda:0",
        )
    )
    assert study.trials[0].user_attrs["precision"] == "fp32"  # flat and short: what the attribute tables show
    assert study.trials[0].user_attrs["device"] == "cuda:0"
