"""Refusing a sweep before anything expensive starts: the config, the Optuna parts and every configuration of the
space composed as a trial would be (validate, validate_optuna, validate_trials)."""
