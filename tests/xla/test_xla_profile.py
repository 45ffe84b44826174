"""`train.profile_steps` on the xla backend: torch_xla's own profiler traces the window into the run's directory
(an XProf log directory, which TensorBoard's profile plugin and XProf open), and the summary names it."""

from __future__ import annotations

import json
from pathlib import Path

from _lane import run_python, xla_env


def test_a_profiled_xla_run_leaves_an_xprof_trace_and_names_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["-m", "trm.train", "experiment=test_tiny", "train.steps=4", "train.log_interval=2", "train.eval_interval=4"]
    args += [f"data.root={tmp_path / 'data'}", f"out_dir={out}", f"hydra.run.dir={out}/hydra", "runtime.backend=xla"]
    proc = run_python([*args, "train.profile_steps=[2,3]"], xla_env(1))
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    trace = Path(summary["profile"])
    assert trace == out / "profile" / "xla"
    written = [p for p in trace.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".xplane.pb") and p.stat().st_size > 0 for p in written), written
