"""The pod soak, short (issue 56, Done when; the full one is `make soak-pod`, 30 minutes): a three-configuration study
on the stand-in gcloud's v5litepod-16 (4 VMs, VFIO chips) with describe errors on a fifth of the calls, a spot
preemption with its notice and a recreate, and one VM silent for a while; the study ends with every configuration
trained, no retry spent, no orphan process and no checkpoint lost beyond one interval (tests/chaos/pod_invariants.py),
checked by the same code as the long soak."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.pod_faults import PodFault, PodSoakSettings
from tests.chaos.pod_soak import global_batch, run_soak
from tests.sweep_helpers import unique_job_name


@pytest.mark.slow  # a pod study on the stand-in gcloud: a driver, four VMs' jobs per trial, a PostgreSQL study
def test_a_short_pod_study_under_faults_ends_with_every_invariant_held(tmp_path: Path, fresh_pg_url: str) -> None:
    settings = PodSoakSettings(
        work=tmp_path,
        shape="v5litepod-16",
        # The study ends by its configurations, not a clock: each fault waits for a job in training, so it lands
        # whatever the load. Three: a fresh configuration follows the preempted one's chain even where the
        # preemption met the second (the first trained too fast) and its continuation had nothing left to train.
        # The timeout only stops a study that has not trained all three by then (~2.5 min here).
        minutes=8.0,
        n_trials=3,
        describe_error_rate=0.2,
        notice_s=10.0,
        recreate_s=15.0,
        hang_s=25.0,
        tpu=unique_job_name(tmp_path),  # the stop's pkill spans the machine: a name of this test's own
    )
    # The preemption 1 s into the first job's training (after the driver, the preflight and a start-up: ~60 s under
    # a loaded suite; its 100 steps train for ~3 s here, and 3 s in met some jobs in their final save); the silent
    # VM 0.5 s into the training of the next attempt, after the recovery (the continuation, or the second
    # configuration where the continuation had nothing left to train): its open sessions end by the keep-alive, the
    # job goes on, the driver attaches again once the VM answers.
    faults = [PodFault("preempt", 20.0, into_training_s=1.0), PodFault("hang_ssh", 20.0, worker=2, into_training_s=0.5)]
    result = run_soak(settings, fresh_pg_url, faults)
    assert result["ok"], result["table"] + "\n" + "\n".join(result["driver_log_tail"])
    assert all(f["injected_at_s"] is not None and f["trial"] for f in result["faults"]), result["faults"]
    assert result["faults"][0]["trial"] != result["faults"][1]["trial"], result["faults"]
    settled = [t for t in result["trials"] if t["state"] in ("COMPLETE", "PRUNED")]
    assert len(settled) == settings.n_trials, result["trials"]  # ended by its budget, not by the timeout
    set_aside = [t for t in result["trials"] if t["state"] == "FAIL"]
    # The preemption met a running trial: set aside (its FAIL says so) and continued, no retry spent.
    assert set_aside and all((t["fail_reason"] or "").startswith("preempted: ") for t in set_aside), result["trials"]
    assert result["vms"] == 4 and result["describes"] > 0


def test_an_eight_vm_slice_gets_a_batch_its_chips_divide() -> None:
    """The seeds' v4-64 (8 VMs, 32 chips) was refused before its study started: test_tiny's batch of 16 is not
    divisible by 32 chips. The 16-chip shapes keep the batch their records were run with."""
    assert global_batch("v4-32") == 16 and global_batch("v5litepod-16") == 16
    assert global_batch("v4-64") == 32 and global_batch("v5litepod-64") == 64
