"""Whether train.kernels' fused kernels can run on a GPU (trm/kernel_choice.py): the tiles that fit each compute
capability's shared memory, the fallback to torch's kernels at model build when a fused choice cannot launch, and the
tile check of the persistent loop (bench/gpu/tile_check.py) in Triton's interpreter, which an off-by-one in its index
fails."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from bench.gpu import tile_check
from tests.test_fused_mix import shape
from tests.test_train import config
from trm.kernel_choice import (
    BF16_TOL,
    KB,
    KERNELS_OF,
    MIX_BACKWARD,
    SHARED_MEMORY_PER_BLOCK,
    SWIGLU_BACKWARD,
    Kernels,
    TileNeed,
    launchable,
    resolve_kernels,
    shared_memory_blocker,
    unfit_kernels,
)
from trm.kernels import fused_mix, fused_swiglu, swiglu_gemms
from trm.model import TRMConfig
from trm.train import run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CPU = torch.device("cpu")
# A channel chunk of 4: the weights' TMA blocks would be 8 bytes wide, under the 16 a TMA copy needs (Triton refuses
# the descriptor at launch, on a GPU as in its interpreter).
UNLAUNCHABLE_MIX_TILE = (64, 4, 4, 3)


def compiled_needs(capability: tuple[int, int], stream: str) -> list[TileNeed]:
    """Every shipped tile's shared memory as Triton compiled it for sm_<capability> (bench/gpu/triton_sm90.py
    --capability, committed in bench/results), the stream bf16 (bf16_reference) or fp32 (bf16)."""
    name = "triton_sm{}{}".format(*capability) + ("_fp32" if stream == "fp32" else "")
    kernels = json.loads((RESULTS / f"{name}.json").read_text())["kernels"]
    return [TileNeed(k["kernel"], (*k["tile"], k["per_sm"]), k["shared_bytes"]) for k in kernels]


def tiny_mlp_t() -> TRMConfig:
    cfg = TRMConfig(hidden_size=16, num_heads=2, expansion=4, L_layers=1, H_cycles=1, L_cycles=1, mixer="mlp_t")
    cfg.seq_len, cfg.puzzle_emb_len = 19, 4
    return cfg


# The mix-backward tiles (channels, chunk, warps, stages, per SM) that fit each capability's shared memory per block,
# as Triton 3.6 compiles them for it with the bf16 stream (bench/results/triton_sm<N>.json).
ALL_MIX_BACKWARD = [(64, 32, 4, 3, 0), (64, 64, 4, 3, 0), (128, 32, 8, 3, 0), (128, 64, 8, 3, 0)]
MIX_BACKWARD_FITTING = {
    (8, 0): ALL_MIX_BACKWARD,  # no TMA: 56-112 KB, in 163
    (8, 6): ALL_MIX_BACKWARD[:3],  # the same sizes, in 99
    (8, 9): ALL_MIX_BACKWARD[:3],  # Ada: sm_86's compile, byte for byte
    (9, 0): ALL_MIX_BACKWARD,  # 108-224 KB, in 227
    (10, 0): ALL_MIX_BACKWARD[:3],  # 116-240 KB
    (12, 0): [(64, 32, 4, 3, 0), (128, 32, 8, 3, 0)],  # 76-144 KB, in 99
}


@pytest.mark.parametrize("stream", ["bf16", "fp32"])
def test_every_capability_fits_a_tile_of_every_kernel_but_not_every_tile(stream: str) -> None:
    """What Triton compiles for each target against the CUDA guide's shared memory per block: every capability has a
    tile of every kernel that fits (none fits no mix-backward tile), but which ones fit differs by target, and sm_90's
    sizes do not carry over: there every mix-backward tile needs >= 108 KB, over consumer GPUs' 99 KB, yet sm_120's
    compile of the two smaller ones fits; sm_100's needs more than sm_90's. The fp32 stream (train.precision=bf16)
    where its compile is committed."""
    suffix = "_fp32" if stream == "fp32" else ""
    compiled = [c for c in SHARED_MEMORY_PER_BLOCK if (RESULTS / "triton_sm{}{}{}.json".format(*c, suffix)).exists()]
    assert stream == "fp32" or set(compiled) == set(MIX_BACKWARD_FITTING) == set(SHARED_MEMORY_PER_BLOCK)
    unread = {SWIGLU_BACKWARD} if stream == "fp32" else set()  # its inputs are bf16 in either stream: compiled once
    for capability in compiled:
        limit, needs = SHARED_MEMORY_PER_BLOCK[capability], compiled_needs(capability, stream)
        assert {n.kernel for n in needs} == set(KERNELS_OF["fused_mix_swiglu"]) - unread
        assert unfit_kernels("fused_mix_swiglu", needs, limit) == {}, capability
        assert shared_memory_blocker("fused_mix_swiglu", capability, needs) == ""
        fitting = sorted(n.tile for n in needs if n.kernel == MIX_BACKWARD and n.shared_bytes <= limit)
        assert fitting == MIX_BACKWARD_FITTING[capability], capability
    sm90 = [n.shared_bytes for n in compiled_needs((9, 0), stream) if n.kernel == MIX_BACKWARD]
    assert min(sm90) // KB == (108 if stream == "bf16" else 92)


def test_a_kernel_with_no_tile_in_the_limit_is_named_with_its_smallest_need() -> None:
    """The capability and the needs as inputs: sm_90's compile of the mix backward (bf16 stream) on a GPU with 99 KB
    per block leaves that kernel no tile; a capability whose limit is unknown blocks nothing."""
    needs = compiled_needs((9, 0), "bf16")
    assert unfit_kernels("fused_mix_swiglu", needs, 99 * KB) == {MIX_BACKWARD: 108 * KB + 24}  # and its barriers
    assert unfit_kernels("fused_mix_nograd", needs, 99 * KB) == {}  # it launches no mix backward
    assert shared_memory_blocker("fused_mix_bwd", (12, 0), needs) == (
        "no tile fits sm_120's 99 KB of shared memory per block (the fused_mix backward's smallest needs 108 KB)"
    )
    assert unfit_kernels("fused_mix_swiglu", needs, 227 * KB) == {}
    assert shared_memory_blocker("fused_mix_bwd", (7, 5), needs) == "" == shared_memory_blocker("torch", (12, 0), needs)


def test_a_fused_choice_whose_trial_launch_fails_keeps_torchs_kernels_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trial launch at model build (Triton's interpreter here) fails on a tile Triton refuses: the choice becomes
    torch with the reason, one warning names it, and the global RNG is where it was (the model's weights are those
    a build without the trial draws)."""
    monkeypatch.setattr(fused_mix, "TILES", (UNLAUNCHABLE_MIX_TILE,))
    chosen = Kernels("fused_mix_nograd", "train.kernels=fused_mix_nograd (explicit)")
    rng = torch.random.get_rng_state()
    with pytest.warns(RuntimeWarning) as caught:
        kernels = launchable(chosen, tiny_mlp_t(), CPU, "bf16_reference", 1)
    assert torch.equal(rng, torch.random.get_rng_state())
    why = "train.kernels=fused_mix_nograd cannot launch on this cpu device: ValueError: Descriptor block shape"
    assert kernels.choice == "torch" and why in kernels.reason and kernels.reason.startswith(chosen.reason)
    assert [str(w.message) for w in caught] == [f"{kernels.warning}; the model keeps torch's kernels"]
    assert why in kernels.warning and "at least 16 bytes" in kernels.warning


def test_a_fused_choice_that_launches_is_kept_without_a_warning() -> None:
    """Every kernel of fused_mix_swiglu runs in the trial (forward without gradients, forward + backward)."""
    chosen = Kernels("fused_mix_swiglu", "train.kernels=fused_mix_swiglu (explicit)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert launchable(chosen, tiny_mlp_t(), CPU, "bf16_reference", 1) == chosen
        assert launchable(Kernels("torch", "explicit"), tiny_mlp_t(), CPU, "fp32", 1) == ("torch", "explicit", "")


def test_auto_on_an_unmeasured_gpu_warns_once_at_build_and_keeps_torch() -> None:
    kernels = resolve_kernels("auto", "cuda", "bf16", shape(), (12, 0))
    with pytest.warns(RuntimeWarning, match="sm_120: the fused kernels are measured on sm_90 only") as caught:
        built = launchable(kernels, shape(), torch.device("cuda"), "bf16", 768)  # torch's: nothing is launched
    assert built.choice == "torch" and len(caught) == 1
    assert resolve_kernels("auto", "cuda", "bf16", shape(), (9, 0)).warning == ""  # measured: fused, no warning


@pytest.mark.slow
def test_a_run_whose_fused_kernels_cannot_launch_trains_on_torchs(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build falls back before the model exists: the start line says torch and why, every step runs."""
    monkeypatch.setattr(fused_mix, "TILES", (UNLAUNCHABLE_MIX_TILE,))
    extra = ("train.steps=2", "train.log_interval=2", "train.eval_interval=2", "train.eval_examples=2")
    extra += ("train.precision=bf16_reference", "train.kernels=fused_mix_nograd")
    with pytest.warns(RuntimeWarning, match="fused_mix_nograd cannot launch on this cpu device"):
        summary = run(config(tmp_path, data_root, *extra))
    assert summary.outcome == "COMPLETE" and summary.steps == 2
    start = next(json.loads(line) for line in capsys.readouterr().out.splitlines() if '"event": "start"' in line)
    assert start["kernels"].startswith("torch (train.kernels=fused_mix_nograd (explicit); train.kernels=fused_mix_nog")


def run_tile_check(out: Path) -> dict:
    """bench/gpu/tile_check.py's CPU mode, in this process (Triton's interpreter: tests/conftest.py); its JSON."""
    try:
        tile_check.main(["--device", "cpu", "--quick", "--out-dir", str(out)])
    except SystemExit as stop:
        assert stop.code == 1  # a failing tile, after the results are written
    return json.loads((out / "tile_check.json").read_text())


def test_the_tile_check_runs_every_tile_and_the_persistent_loop_on_the_interpreter(tmp_path: Path) -> None:
    result = run_tile_check(tmp_path)
    tiles = {(t["kernel"], tuple(t["tile"])) for t in result["tiles"]}
    assert tiles == {(kernel, tuple(tile)) for kernel, shipped in swiglu_gemms.TILES.items() for tile in shipped}
    persistent = [t for t in result["tiles"] if t["tile"][5]]
    assert persistent and all(t["same_bits_as_one_program_per_tile"] is True for t in persistent)
    assert result["passes"] and all(t["passes"] for t in result["tiles"])


def test_an_off_by_one_in_the_persistent_loops_index_fails_the_tile_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation: the epilogue's tile count starts one tile late, in the compiled loop and in the interpreter's
    twin (the same line). The interpreter runs the twin with 2 programs over 4 tiles: results land one tile off,
    and the tile check fails that tile, and only that one."""
    source = Path(swiglu_gemms.__file__).read_text()
    line = "stored = tile - tl.num_programs(0)"
    assert source.count(line) == 2  # the compiled persistent loop and its interpreter twin
    mutated = tmp_path / "swiglu_gemms_off_by_one.py"
    mutated.write_text(source.replace(line, f"{line} + 1"))
    spec = importlib.util.spec_from_file_location("swiglu_gemms_off_by_one", mutated)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(fused_swiglu, "swiglu_gemms", module)  # what fused_swiglu launches
    result = run_tile_check(tmp_path / "out")
    failed = [tuple(t["tile"]) for t in result["tiles"] if not t["passes"]]
    assert not result["passes"] and failed == [(128, 128, 64, 8, 3, 1)]
    persistent = next(t for t in result["tiles"] if t["tile"][5])
    assert persistent["same_bits_as_one_program_per_tile"] is False
    assert not persistent["max_relative_error"] < BF16_TOL  # NaN too: the tile never stored holds what memory held


@pytest.mark.slow
def test_the_committed_sm120_needs_are_what_triton_compiles(tmp_path: Path) -> None:
    """bench/results/triton_sm120.json, which the fit above reads, against a fresh compile for sm_120 (the target
    where sm_90's sizes would mislead most)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu.triton_sm90", "--capability", "120", "--out-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    fresh = json.loads((tmp_path / "triton_sm90.json").read_text())["kernels"]
    assert [TileNeed(k["kernel"], (*k["tile"], k["per_sm"]), k["shared_bytes"]) for k in fresh] == compiled_needs(
        (12, 0), "bf16"
    )
