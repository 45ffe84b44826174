"""The search: studies, search spaces, trial lifecycle, launchers. Entry point: `python -m sweeps.run`."""
