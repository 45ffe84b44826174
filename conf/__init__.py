"""The Hydra configs, shipped in the wheel as the package `trm_sweeps_conf` (pyproject.toml maps it to conf/).

Both apps search `pkg://trm_sweeps_conf`, so an installed wheel and a checkout read the same YAML; a user's own
groups (say `study/*.yaml`) come in with `--config-dir`.
"""
