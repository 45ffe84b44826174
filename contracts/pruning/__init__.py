"""The project's own pruning rules, beside Optuna's: each a module here and a conf/pruner/ file. The package as a whole
is on the pruner allowlist (contracts/pruners.py), so a new rule names no class anywhere else."""
