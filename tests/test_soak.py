"""The soak in the suite (issue 14, "a study's record is always true"): bench/soak.py's machinery on 8 trials and
2 drivers sharing one study on a private PostgreSQL cluster, with every fault injected exactly once at a fixed
point: a running job SIGKILLed, another SIGSTOPped past stall_timeout_s, a driver SIGKILLed and started again
with the same arguments, PostgreSQL stopped for 10 s and started again. Then every check of bench/soak.py
(docs/reliability.md, Soak): states, reasons, recoveries, budget, no configuration trained twice, every COMPLETE
value traceable to a summary.json and a checkpoint of exactly its parameters, no process left behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import soak


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_fault_once_and_the_study_record_stays_true(tmp_path: Path) -> None:
    # stall_timeout_s: a trial's start-up (imports, data, model, attaching to its trial) took up to ~25 s on this
    # 2-core machine under a loaded suite; 20 s failed healthy jobs there. grace_s above the PostgreSQL outage (5 s
    # down, ~8 s with stop and start): no heartbeat can be written during it, and a shorter grace let a driver judge
    # a live driver's trial orphaned right after it (1 run in 3 of the suite).
    settings = soak.SoakSettings(
        work=tmp_path / "soak", n_trials=8, drivers=2, max_concurrent=1, seed=1, train_steps=40, eval_interval=10,
        stall_timeout_s=45, grace_s=15, pruner="none", pg_down_s=5, driver_restart_s=1, target_wait_s=150, timeout_s=480,
    )  # fmt: skip
    # Fixed points: each fault once the study has launched k jobs (retries count), on a job past the given step (a
    # job killed at step 20 has its step-10 checkpoint). One after the other, each on a trial no earlier fault hit;
    # the database restart first, while jobs train, so that no other fault's recovery is in flight during it.
    faults = [
        soak.scheduled("restart_pg", after_starts=2, min_step=10),
        soak.scheduled("kill_job", after_starts=3, min_step=20),
        soak.scheduled("kill_driver", after_starts=5),
        soak.scheduled("stop_job", after_starts=6, min_step=10),
    ]
    with soak.PrivatePostgres() as pg:
        result = soak.run_soak(settings, faults, pg=pg)
    print(result["table"])
    assert result["fault_counts"] == {"kill_job": 1, "stop_job": 1, "kill_driver": 1, "restart_pg": 1}
    failed = [f"{c['check']}: {c['detail']}" for c in result["checks"] if not c["ok"]]
    assert not failed, "\n".join(failed) + "\n\n" + result["table"] + "\n\n" + soak.log_tails(result)
