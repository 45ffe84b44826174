"""The prepared device call (bench/gpu/session.py) in its CPU mode: every part that can run without a GPU runs, on tiny
shapes through Triton's interpreter, and the one that cannot says why; a failing part loses no other part's result;
docs/benchmarks.md's GPU rows are what bench/gpu/docs.py renders from the output they name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import docs as gpu_docs
from bench.gpu import session as gpu_session
from bench.gpu.candidates import fastest_passing

ROOT = Path(__file__).resolve().parents[1]
DOC_MAX_LINES = 400  # docs/benchmarks.md holds current results only (docs/benchmarks-history.md the rest)


@pytest.fixture(scope="module")
def cpu_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m bench.gpu.session --device cpu`, as a user runs it; its output directory."""
    out = tmp_path_factory.mktemp("gpu_session")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu.session", "--device", "cpu", "--out-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


def read(out: Path, name: str) -> Any:
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_the_cpu_mode_runs_every_part_but_the_profile_and_says_why(cpu_session: Path) -> None:
    session = read(cpu_session, "gpu_session")
    rows = {r["part"]: r for r in session["parts"]}
    assert list(rows) == [p.name for p in gpu_session.PARTS]
    assert session["budget_s"] == gpu_session.SESSION_BUDGET_S == 480 and session["reference"] is None
    assert session["not_run"] == {
        "profile": "torch.profiler's CUDA kernel times need a GPU", "reference": gpu_session.NO_REFERENCE
    }  # fmt: skip
    assert session["triton"] == "interpreter (TRITON_INTERPRET=1)"
    assert rows["profile"] == {
        "part": "profile", "module": "bench.gpu.profile", "budget_s": 75, "status": "skipped",
        "reason": "torch.profiler's CUDA kernel times need a GPU",
    }  # fmt: skip
    for name, row in rows.items():
        if name != "profile":
            assert row["status"] == "ok" and row["rc"] == 0 and (cpu_session / row["result"]).exists(), row

    candidates = read(cpu_session, "gpu_candidates")  # the shipped choices in the same rounds, the peak in each
    variants = {v["variant"]: v for v in candidates["variants"]}
    assert set(variants) == {"ours torch", "ours fused_mix_swiglu"}
    assert all(v["rounds"] == [0, 1] and v["samples_per_s"] > 0 for v in variants.values())
    assert candidates["matmul"]["rounds"]["bf16"] == [0, 1] and candidates["gradient_check"] == []

    tiles = read(cpu_session, "tile_check")["tiles"]  # every shipped tile; the persistent loop against its twin
    assert tiles and all(t["passes"] for t in tiles)
    assert any(t["tile"][5] and t["same_bits_as_one_program_per_tile"] is True for t in tiles)

    checks = {c["choice"]: c for c in read(cpu_session, "gradient_check")["gradient_check"]}
    assert set(checks) == {"torch", "fused_mix_swiglu"} and all(c["passes"] for c in checks.values())
    merged = {"variants": candidates["variants"], "gradient_check": list(checks.values()), "tile_check": tiles}
    assert session["winner"] == fastest_passing(merged) in ("torch", "fused_mix_swiglu")

    train = read(cpu_session, "bf16_train")  # trm.train, train.precision=bf16, to its end
    assert train["returncode"] == 0 and train["summary"]["outcome"] == "COMPLETE" and train["summary"]["steps"] == 4
    assert "train.precision=bf16" in train["train_command"] and train["train"] and train["eval"]

    curves = read(cpu_session, "kernel_curves")  # same weights, same batch: the curves agree to bf16 rounding
    assert {name: len(c) for name, c in curves["curves"].items()} == {"ours torch": 2, "ours fused_mix_swiglu": 2}
    (pair,) = curves["differences"]
    assert pair["steps"] == 2 and pair["max_relative_difference"] < 0.05


@pytest.mark.slow
def test_the_docs_rows_render_from_the_cpu_modes_output_within_the_pages_length(cpu_session: Path) -> None:
    loaded = gpu_docs.load(cpu_session)
    row = gpu_docs.current_row(loaded, "out")
    winner = read(cpu_session, "gpu_session")["winner"]
    assert row.startswith("| GPU step | tiny, bf16_reference, compile=off, batch 2:") and f"={winner}`" in row
    block = gpu_docs.block(loaded, "out")
    assert block[1].startswith("| runner (tiny, batch 2, bf16_reference, compile=off, 2 rotating rounds) | samples/s |")
    assert block[-1] == gpu_docs.END
    text = " ".join(block)
    assert "No result: the profile (torch.profiler's CUDA kernel times need a GPU)." in text
    assert "Curves (2 steps, one batch of 2, the same weights; no reference)" in text and "failed parts: none" in text
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    written = gpu_docs.write(doc, loaded, "out")
    assert gpu_docs.source_in(written) == "out" and gpu_docs.write(written, loaded, "out") == written
    assert len(written.splitlines()) <= DOC_MAX_LINES  # a whole session's block fits the page as it stands


def test_the_docs_gpu_rows_are_what_their_named_source_renders() -> None:
    """Regenerated from the output only: rendering the source the page names again changes nothing."""
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    source = gpu_docs.source_in(doc)
    assert source is not None and (ROOT / source).exists()
    assert gpu_docs.write(doc, gpu_docs.load(ROOT / source), source) == doc
    assert len(doc.splitlines()) <= DOC_MAX_LINES


def test_a_failing_part_is_recorded_and_the_next_part_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process (the CPU mode's way): a part that exits with an error is a failed row with its message, and the
    part after it runs and writes its result; the session then exits 1."""

    def bad(args: Any, _: dict[str, Any]) -> list[str]:
        return ["--device", "cpu", "--candidates", "torch,no_such_kernels", "--out-dir", str(args.out_dir)]

    def good(args: Any, _: dict[str, Any]) -> list[str]:
        return ["--device", "cpu", "--quick", "--candidates", "torch", "--out-dir", str(args.out_dir)]

    parts = (
        gpu_session.Part("first", "bench.gpu.gradient_check", "first", 1, bad),
        gpu_session.Part("second", "bench.gpu.gradient_check", "gradient_check", 60, good),
    )
    monkeypatch.setattr(gpu_session, "PARTS", parts)
    with pytest.raises(SystemExit) as stop:
        gpu_session.main(["--device", "cpu", "--out-dir", str(tmp_path)])
    assert stop.value.code == 1
    first, second = read(tmp_path, "gpu_session")["parts"]
    assert first["status"] == "failed" and first["rc"] == 1 and "no_such_kernels" in first["error"]
    assert second["status"] == "ok" and second["result"] == "gradient_check.json"
    assert read(tmp_path, "gradient_check")["passes"] is True


@pytest.mark.slow
def test_a_part_past_its_budget_is_killed_with_its_process_group(tmp_path: Path) -> None:
    """On the device each part is a process of its own, killed at its budget: the session goes on."""
    part = gpu_session.Part("sleeper", "timeit", "none", 1, lambda *_: [])
    log = tmp_path / "sleeper.log"
    outcome = gpu_session.run_as_process(part, ["-n", "1", "import time; time.sleep(60)"], log, 1.0)
    assert outcome == {"rc": -9, "timed_out": True}
    assert gpu_session.run_as_process(part, ["-n", "1", "pass"], log, 30.0) == {"rc": 0}
