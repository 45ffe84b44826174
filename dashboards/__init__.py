"""Looking at results: `python -m dashboards.serve` (optuna-dashboard on the study storage) and
`python -m dashboards.report study=NAME` (one self-contained plotly HTML report). Both need only the storage."""
