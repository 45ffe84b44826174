"""The stand-in TPU VMs' Python start-up (tests/fake_gcloud/gcloud puts this directory on their PYTHONPATH where
$FAKE_GCS_ROOT is set): gs:// is the stand-in bucket store (tests/fake_gcs.py), as gcsfs installed on a real VM
makes it Google Cloud Storage. Loaded by its path: the VM imports nothing of the tests' package."""

import importlib.util
import os
import pathlib

# An interpreter without fsspec (gcloud's own, run by a caller whose PYTHONPATH holds this directory) has no gs://
# to give: it starts without the store rather than with "Error in sitecustomize" on its stderr.
if os.environ.get("FAKE_GCS_ROOT") and importlib.util.find_spec("fsspec") is not None:
    _spec = importlib.util.spec_from_file_location(
        "fake_gcs", pathlib.Path(__file__).resolve().parents[2] / "fake_gcs.py"
    )
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
        _module.register()
