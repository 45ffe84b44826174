"""The training config's schema: conf/train.yaml and its groups as dataclasses in Hydra's ConfigStore.

conf/train.yaml starts its defaults list with `train_schema` (`TrainApp`), so Hydra checks every key, type and
choice of the trainer's blocks while it composes: a typo'd key, `train.steps=abc` or `train.compile=fast` fails
there, naming the key and the value (a `Literal` names what it accepts). The blocks' __post_init__ check ranges and
relations (`train.steps >= 1`, a curriculum of >= 2 stages, betas in [0, 1)); Hydra never constructs the
dataclasses: `check_train_config` does after composing, `contracts.hydra_app.typed_train_config` for the `TrainApp`
an entry point's main hands down. The values live in conf/ only: a field's default is MISSING, except
RetryPolicy's, which code uses without a config (tests/test_conf_defaults.py keeps them equal to conf/train.yaml's).

A group option with keys of its own extends its group's schema in its defaults list (`adamw_schema`); an option
without one is typed by its group's base class. `data` has no base: each option names its own schema
(`sudoku_generated_schema`), as a preset may set another option's keys. Not typed here: `arch`
(trm.model_config.TRMConfig checks it against the dataset before a model is built), `data=sudoku_extreme` (the
loader checks its source and path), and the groups the sweep shares (`wandb`, `sweep.storage_engine`:
conf/wandb/default.yaml, conf/storage/engine/).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from contracts.choices import Bf16Mode, CompileSetting, Device, KernelChoice, PrecisionRequest
from contracts.metric_names import EVAL_METRICS
from contracts.schema_checks import ConfigSchemaError, at_least, build, one_of, require, seconds


@dataclass
class TrainLoop:
    """`train`: the loop (trm/train.py). Steps, intervals and batches are counts >= 1."""

    steps: int = MISSING
    stop_after: int | None = MISSING
    global_batch_size: int = MISSING
    eval_interval: int = MISSING  # may exceed steps: the last step evaluates anyway
    log_interval: int = MISSING
    eval_examples: int | None = MISSING
    eval_batch_size: int = MISSING
    loss: Literal["stablemax", "softmax"] = MISSING
    precision: PrecisionRequest = MISSING
    bf16_mode: Bf16Mode = MISSING
    compile: CompileSetting = MISSING
    kernels: KernelChoice = MISSING
    grad_clip: float = MISSING
    ema: bool = MISSING
    eval_with_ema: bool = MISSING
    objective: str = MISSING
    objective_direction: Literal["maximize", "minimize"] = MISSING
    progress: bool = MISSING
    preemption_check_interval: int = MISSING
    profile_steps: list[int] | None = MISSING  # [a, b]: trace steps a..b on rank 0 (trm/measures/profiling.py)

    def __post_init__(self) -> None:
        for key in ("steps", "global_batch_size", "eval_interval", "log_interval", "eval_batch_size"):
            at_least(f"train.{key}", getattr(self, key), 1)
        at_least("train.preemption_check_interval", self.preemption_check_interval, 1)
        at_least("train.stop_after", self.stop_after, 1, none="no early stop")
        at_least("train.eval_examples", self.eval_examples, 1, none="the whole test split")
        require("train.grad_clip", self.grad_clip, self.grad_clip >= 0, ">= 0 (0: off)")
        one_of("train.objective", self.objective, EVAL_METRICS)
        window = self.profile_steps
        if window is not None and not (len(window) == 2 and 1 <= window[0] <= window[1]):
            raise ConfigSchemaError(
                f"train.profile_steps={list(window)!r}: expected [first, last] steps to trace, 1 <= first <= last "
                "(e.g. [10, 15]), or null"
            )


@dataclass
class OptimConfig:
    """`optim` (conf/optim/_base.yaml and each optimizer's file; trm/optim.py)."""

    name: Literal["adam_atan2", "adamw", "lion"] = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    betas: list[float] = MISSING
    warmup_steps: int = MISSING
    lr_min_ratio: float = MISSING
    puzzle_emb_lr: float = MISSING
    puzzle_emb_weight_decay: float = MISSING
    ema_decay: float = MISSING

    def __post_init__(self) -> None:
        require("optim.lr", self.lr, self.lr > 0, "> 0")
        require("optim.weight_decay", self.weight_decay, self.weight_decay >= 0, ">= 0")
        betas = list(self.betas)
        require("optim.betas", betas, len(betas) == 2 and all(0 <= b < 1 for b in betas), "two values in [0, 1)")
        require("optim.warmup_steps", self.warmup_steps, self.warmup_steps >= 0, ">= 0 (0: no warmup)")
        require("optim.lr_min_ratio", self.lr_min_ratio, 0 <= self.lr_min_ratio <= 1, "a value in [0, 1]")
        require("optim.puzzle_emb_lr", self.puzzle_emb_lr, self.puzzle_emb_lr > 0, "> 0")
        wd = self.puzzle_emb_weight_decay
        require("optim.puzzle_emb_weight_decay", wd, wd >= 0, ">= 0")
        require("optim.ema_decay", self.ema_decay, 0 <= self.ema_decay <= 1, "a value in [0, 1]")


@dataclass
class AdamWConfig(OptimConfig):
    """`optim=adamw`: AdamW's eps besides (conf/optim/adamw.yaml)."""

    eps: float = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        require("optim.eps", self.eps, self.eps > 0, "> 0")


@dataclass
class GeneratedDataConfig:
    """`data=sudoku_generated`: puzzles generated from the seed on each worker into `path` (trm/data/build.py)."""

    source: Literal["generate", "path"] = MISSING
    path: str = MISSING
    root: str = MISSING
    num_train: int = MISSING
    num_test: int = MISSING
    blanks: int = MISSING
    num_aug: int = MISSING
    seed: int = MISSING

    def __post_init__(self) -> None:
        for key in ("num_train", "num_test"):  # an empty split builds, and fails the run that uses it
            at_least(f"data.{key}", getattr(self, key), 1)
        for key in ("blanks", "num_aug", "seed"):
            at_least(f"data.{key}", getattr(self, key), 0)


@dataclass
class CurriculumConfig:
    """`curriculum` (trm/schedules.py); how its start values relate to the arch's: schedules.validate_curriculum."""

    enabled: bool = MISSING
    start_H_cycles: int = MISSING
    start_L_cycles: int = MISSING
    end_fraction: float = MISSING
    stages: int = MISSING

    def __post_init__(self) -> None:
        if not self.enabled:  # a disabled curriculum's values are never read
            return
        require("curriculum.stages", self.stages, self.stages >= 2, ">= 2 for an enabled curriculum")
        require("curriculum.end_fraction", self.end_fraction, 0 < self.end_fraction <= 1, "a value in (0, 1]")
        for key in ("start_H_cycles", "start_L_cycles"):
            at_least(f"curriculum.{key}", getattr(self, key), 1)


@dataclass
class HaltingConfig:
    """`halting`: the exploration of the ACT steps (trm/schedules.py exploration_at)."""

    exploration_prob: float = MISSING
    adaptive: bool = MISSING
    final_exploration_prob: float = MISSING
    decay_end_fraction: float = MISSING

    def __post_init__(self) -> None:
        for key in ("exploration_prob", "final_exploration_prob"):
            value = getattr(self, key)
            require(f"halting.{key}", value, 0 <= value <= 1, "a probability in [0, 1]")
        end = self.decay_end_fraction
        require("halting.decay_end_fraction", end, end >= 0, ">= 0 (0: the final probability from the start)")


@dataclass
class CheckpointConfig:
    """`checkpoint` (trm/checkpoints/checkpoint.py; staging and upload: trm/checkpoints/upload.py)."""

    url: str = MISSING
    resume: bool = MISSING
    keep_best: bool = MISSING
    lock_wait_s: float = MISSING
    staging: Literal["auto", "always", "never"] = MISSING
    local_dir: str = MISSING
    upload_wait_s: float = MISSING
    stop_grace_s: float | None = MISSING

    def __post_init__(self) -> None:
        require("checkpoint.lock_wait_s", self.lock_wait_s, self.lock_wait_s >= 0, ">= 0 seconds")
        require("checkpoint.upload_wait_s", self.upload_wait_s, self.upload_wait_s >= 0, ">= 0 seconds")
        grace = self.stop_grace_s
        require("checkpoint.stop_grace_s", grace, grace is None or grace >= 0, ">= 0 seconds, or null for no deadline")
        require(
            "checkpoint.local_dir",
            self.local_dir,
            "://" not in self.local_dir and self.local_dir.rstrip("/") != self.url.rstrip("/"),
            f"a local directory other than checkpoint.url ({self.url!r}): the staged copy is not the uploaded one",
        )


@dataclass
class ReevalConfig:
    """`reeval`: evaluate this run's checkpoint again instead of training (trm/reeval.py)."""

    run: bool = MISSING
    checkpoint: Literal["best.pt", "latest.pt"] = MISSING
    examples: int | None = MISSING

    def __post_init__(self) -> None:
        at_least("reeval.examples", self.examples, 1, none="the whole test split")


@dataclass
class RuntimeConfig:
    """`runtime` (trm/runtime/): the backend, the device, and the control plane a pod's workers meet on."""

    backend: Literal["auto", "single", "torch", "xla"] = MISSING
    device: Device = MISSING
    timeout_s: float = MISSING
    port: int = MISSING
    rank: int | None = MISSING
    world_size: int | None = MISSING
    master_addr: str | None = MISSING
    expected_devices: int | None = MISSING
    compile_cache_dir: str | None = MISSING  # a local directory: trm/runtime/__init__.py compile_cache_dir
    compile_cache_subdir: str | None = MISSING

    def __post_init__(self) -> None:
        seconds("runtime.timeout_s", self.timeout_s)
        require("runtime.port", self.port, 1 <= self.port <= 65535, "a TCP port in [1, 65535]")
        at_least("runtime.rank", self.rank, 0, none="from the environment")
        at_least("runtime.world_size", self.world_size, 1, none="from the environment")
        at_least("runtime.expected_devices", self.expected_devices, 1, none="any count")
        if self.rank is not None and self.world_size is not None:
            require("runtime.rank", self.rank, self.rank < self.world_size, f"< runtime.world_size={self.world_size}")


@dataclass
class RetryPolicy:
    """`sweep.report_retry`: how long rank 0 keeps trying one storage call, so that a database restart does not lose
    a report (trm/links/trial.py). The defaults are conf/train.yaml's (tests/test_conf_defaults.py)."""

    attempts: int = 10  # tries of one call before it fails (TrialLinkError)
    first_delay_s: float = 0.5  # wait after the first failed try, doubled after each further one ...
    max_delay_s: float = 10.0  # ... up to this

    def __post_init__(self) -> None:
        at_least("sweep.report_retry.attempts", self.attempts, 1)
        for key in ("first_delay_s", "max_delay_s"):
            value = getattr(self, key)
            require(f"sweep.report_retry.{key}", value, value >= 0, "seconds >= 0")

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | DictConfig | None, where: str = "sweep.report_retry") -> RetryPolicy:
        """The policy a config block sets (None: the defaults); a ValueError names a bad key or value."""
        return build(cls, node, where)


@dataclass
class SweepLink:
    """`sweep`: the link to a sweep trial, set by the driver (a plain run leaves study null; trm/links/trial.py)."""

    study: str | None = MISSING
    study_uid: str | None = MISSING
    trial_number: int | None = MISSING
    storage: str | None = MISSING
    password_env: str | None = MISSING
    seed_index: int = MISSING
    job: str | None = MISSING
    sampled: list[str] | None = MISSING  # the override keys the study sampled (sweeps' job command line)
    # A confirm job (sweeps/trials/confirm.py): trial_number's configuration trained again on `seed`; it stores a
    # storage.confirm_record.ConfirmSeed on the study and never reports to the finished trial (trm/links/confirm.py).
    confirm: bool = MISSING
    report_retry: RetryPolicy = field(default_factory=RetryPolicy)
    # rank 0's host memory sampled this often onto its trial (trm/measures/memory_watch.py)
    memory_sample_s: float = MISSING
    storage_engine: Any = MISSING  # conf/storage/engine/default.yaml, shared with the sweep: storage/engine_config.py

    def __post_init__(self) -> None:
        at_least("sweep.seed_index", self.seed_index, 0)
        seconds("sweep.memory_sample_s", self.memory_sample_s)
        at_least("sweep.trial_number", self.trial_number, 0, none="not a trial")


@dataclass
class TrainApp:
    """conf/train.yaml: the typed blocks, and the groups typed by their own schemas or not at all (a dict)."""

    seed: int = MISSING
    out_dir: str | None = MISSING  # ${hydra:runtime.output_dir}: None outside a run (`--cfg job --resolve`)
    arch: dict[str, Any] = MISSING  # trm.model_config.TRMConfig, built with the dataset's sizes (contracts: no trm)
    optim: OptimConfig = MISSING
    # Typed by each option's own schema (a GeneratedDataConfig; data=sudoku_extreme: a dict), as a preset may set
    # keys of another option (experiment=test_tiny: generated data's sizes, unread by data=sudoku_extreme).
    data: Any = MISSING
    curriculum: CurriculumConfig = MISSING
    halting: HaltingConfig = MISSING
    train: TrainLoop = MISSING
    checkpoint: CheckpointConfig = MISSING
    reeval: ReevalConfig = MISSING
    runtime: RuntimeConfig = MISSING
    sweep: SweepLink = MISSING
    wandb: dict[str, Any] = MISSING  # conf/wandb/default.yaml is shared with the sweep, which types it itself


# The blocks with a __post_init__, run by check_train_config.
CHECKED_BLOCKS = ("train", "optim", "data", "curriculum", "halting", "reeval", "runtime", "sweep")


def register() -> None:
    """Put the schemas in Hydra's ConfigStore (before composing `train`; storing again replaces them)."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainApp, replace=True)
    store.store(name="adamw_schema", node=AdamWConfig, replace=True)
    store.store(name="sudoku_generated_schema", node=GeneratedDataConfig, replace=True)


def check_train_config(cfg: DictConfig) -> None:
    """Run the __post_init__ checks of each typed block of a composed training config (Hydra checked the types).
    A block with a mandatory value not given yet (`???`) is left to whoever reads that value (OmegaConf names it)."""
    for key in CHECKED_BLOCKS:
        node = cfg.get(key)
        if not isinstance(node, DictConfig) or not OmegaConf.is_dict(node) or OmegaConf.missing_keys(node):
            continue
        try:
            OmegaConf.to_object(node)
        except ValueError as err:  # __post_init__'s, or OmegaConf's (a ValidationError is one)
            raise ConfigSchemaError(str(err).splitlines()[0]) from None
