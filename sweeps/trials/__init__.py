"""A trial's life: started on a slot (trial_runner), watched while it runs (running, progress), judged when it
ends (outcome, retry), recovered when its driver or machine is gone (recovery, preemption, rerun), re-evaluated
(reeval) and summarised on W&B (wandb_summary); where its files go (paths)."""
