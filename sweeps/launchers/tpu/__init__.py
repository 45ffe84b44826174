"""The TPU pod launcher's room: the launcher (launcher), its knobs and calls to gcloud (calls) and its VMs' set-up
(setup), its gcloud command lines (gcloud), the slice as it describes itself (slice) and the asking (describe), what
it hands a VM's shell (shell), and the preflight (preflight), its probe (probe) and its asking every VM at once
(ask)."""
