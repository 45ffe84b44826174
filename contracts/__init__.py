"""The torch-free contracts that the trainer (`trm`) and the platform (`sweeps`, `dashboards`) both read.

The Hydra app plumbing and the config package (hydra_app), the training config's schema (train_config, with
schema_checks), the metric names (metric_names), a run's metrics file (metrics_log), the training choices
(choices), Hydra's override grammar (overrides) and a W&B run's ids and modes (wandb_runs). `make lint` holds the layers (pyproject.toml,
[tool.importlinter]): this package imports neither `trm`, `sweeps`, `dashboards` nor torch, so the driver and
the report validate and read what a job writes without importing the model.
"""
