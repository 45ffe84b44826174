"""A run's checkpoint files: written atomically to a path or fsspec URL and read back with their identity
(checkpoint), uploaded off the training path (upload), what best.pt holds (best_file), one writer per local
directory (writer_lock).

Below the training state: these modules import nothing else of trm (an import contract in pyproject.toml). What a
checkpoint holds is trm/train_state.py's; the collective save and resume around these files is trm/checkpointer.py's.
"""
