"""Training overrides shared by the tests: a model and data small enough to train for real in seconds."""

# A 16-wide, one-layer TRM with 2 H cycles x 1 L cycle and up to 3 halting steps, in fp32 on every machine: the
# default train.precision=auto would pick bf16 on a CPU with bf16 units, and the numbers the tests compare
# (resume continuity, XLA against eager CPU) must not depend on the machine that runs them.
TINY_MODEL = [
    "train.precision=fp32",
    "arch.hidden_size=16",
    "arch.num_heads=2",
    "arch.L_layers=1",
    "arch.H_cycles=2",
    "arch.L_cycles=1",
    "arch.halt_max_steps=3",
]
# 200 generated puzzles with 10 blanks; batches of 16 (divisible by 1, 2 and 4 processes).
TINY_DATA = ["data.num_train=200", "data.num_test=32", "data.blanks=10"]
TINY_BATCHES = [
    "train.global_batch_size=16",
    "train.eval_examples=32",
    "train.eval_batch_size=16",
    "train.progress=false",
]
TINY_RUN = [*TINY_MODEL, *TINY_DATA, *TINY_BATCHES]
