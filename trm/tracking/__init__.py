"""Experiment tracking on rank 0 (W&B): the tracker the loop logs to (tracker) and what a trial's run is: its name,
group, config, tags and summary (run_config).

Above the model: the model, its step and the training state never import this room (an import contract in
pyproject.toml).
"""
