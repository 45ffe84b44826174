"""The TPU pod launcher's room: the launcher (launcher), its gcloud command lines (gcloud), the slice as it describes
itself (slice) and the asking (describe), what it hands a VM's shell (shell), and the preflight's probe (probe) and
its asking every VM at once (ask)."""
