"""Typed configuration of the trainer-owned groups and the top-level :class:`PPOConfig`.

The dataclasses are the one source of every default: Hydra composes ``config/ppo_trainer.yaml``,
which holds only Hydra's own settings, over :class:`PPOConfig` (registered as the schema
``ppo_trainer_schema``), so ``RayPPOTrainer(PPOConfig())`` in a notebook and the bare
``python -m hybrid_rl.trainer.main_ppo`` run the same job, and a misspelt key or a wrong type is an
error at composition time. Keys that follow another key unless set (veRL's YAML interpolations,
``rollout.response_length`` -> ``data.max_response_length``) are listed in :data:`LINKED_DEFAULTS`.
Key names follow veRL wherever the feature is the same. The worker groups (``actor_rollout_ref``,
``critic``) are the workers' own dataclasses from :mod:`hybrid_rl.workers.config`.

Values computed from the config (device, world size, number of steps) never overwrite a field the
user set: they live in :class:`hybrid_rl.trainer.config.checks.RunPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar

from hybrid_rl.algorithms.rollout_correction import RolloutCorrectionConfig
from hybrid_rl.workers.distillation_config import DistillationConfig
from hybrid_rl.buffer.base import BufferConfig
from hybrid_rl.utils.bounds import bounded
from hybrid_rl.workers.config import ActorRolloutRefConfig, CriticConfig, CriticModelConfig, FSDPConfig
from hybrid_rl.workers.weight_transfer.export import DEFAULT_BUCKET_BYTES
from hybrid_rl.workers.weight_transfer.handle import TRANSPORTS


@dataclass
class ArithmeticDataConfig:
    """The synthetic arithmetic task used when ``data.train_files`` is unset."""

    cache_dir: str = "~/.cache/hybrid_rl/arithmetic"
    """Folder where ``train.parquet`` / ``test.parquet`` are generated on first use."""
    num_train: int = bounded(100, ge=1, fix="use e.g. 100")
    """Number of training problems to generate."""
    num_test: int = bounded(200, ge=1, fix="use e.g. 200")
    """Number of held-out problems (the validation set) to generate."""
    seed: int = 0
    """Seed of the problem generator (train and test sets are disjoint)."""
    ops: list[str] = field(default_factory=lambda: ["+", "-", "*"])
    """Operations to draw problems from (any of + - *)."""
    min_digits: int = bounded(1, ge=1, fix="use 1 or more")
    """Fewest digits of an operand."""
    max_digits: int = bounded(1, ge=1, fix="use 1 or more")
    """Most digits of an operand (1 digit x 3 ops = 300 distinct problems in all)."""
    num_shots: int = bounded(1, ge=0, fix="use 0 (the bare question) or e.g. 1")
    """Solved training problems of the same operation shown as earlier chat turns before each
    question (0 = the bare question). Small instruct models need one to follow the answer format."""


@dataclass
class DataConfig:
    """Datasets, prompt/response lengths and batch sizes (veRL ``data.*``)."""

    tokenizer: Optional[str] = None
    """Tokenizer path; null uses ``actor_rollout_ref.model.path``."""
    train_files: Any = None
    """Data file(s) with the training prompts: ``.parquet``, ``.jsonl``, ``.json``, ``.jsonl.gz``,
    ``.json.gz``, folders or globs of them. Null = the synthetic arithmetic task generated into
    ``data.arithmetic.cache_dir``."""
    val_files: Any = None
    """Data file(s) for validation (as ``train_files``). Null = the arithmetic test split when train_files is null,
    else no validation."""
    prompt_key: str = "prompt"
    """Column holding the chat messages of the prompt."""
    reward_fn_key: str = "data_source"
    """Column that selects the scoring function (rule-based rewards are registered by it)."""
    max_prompt_length: int = bounded(128, ge=1, fix="use e.g. 128 tokens")
    """Prompts longer than this (in tokens) are filtered or truncated (see below)."""
    max_response_length: int = bounded(16, ge=1, fix="use e.g. 256 tokens")
    """Maximum number of generated tokens per response."""
    train_batch_size: int = bounded(16, ge=1, fix="use a positive number of prompts")
    """Prompts per training step (each is sampled ``rollout.n`` times)."""
    val_batch_size: Optional[int] = bounded(None, ge=1, fix="use null (all at once) or e.g. 64")
    """Prompts per validation generate call; null = the whole validation set at once."""
    filter_overlong_prompts: bool = True
    """Drop prompts longer than ``max_prompt_length`` when the dataset is loaded."""
    truncation: str = "error"
    """What to do with an overlong prompt that was not filtered: error | left | right."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch (seeded by ``data.seed``)."""
    seed: int = 1
    """Seed of the training sampler's shuffle."""
    return_raw_chat: bool = True
    """Keep each prompt's chat messages (untemplated) as ``raw_prompt`` beside the token ids."""
    bad_rows: str = "error"
    """A malformed row: error (stop, naming the file, row and reason) | skip (leave it out, count the
    reasons, report them in one line)."""
    max_bad_fraction: float = bounded(0.01, ge=0, lt=1, fix="use a fraction such as 0.01")
    """With ``bad_rows=skip``: refuse to start when more than this fraction of the rows is bad."""
    arithmetic: ArithmeticDataConfig = field(default_factory=ArithmeticDataConfig)
    """Synthetic arithmetic task settings (only used when ``train_files`` is null)."""


@dataclass
class KLCtrlConfig:
    """KL coefficient controller for the in-reward KL penalty (``algorithm.kl_ctrl.*``)."""

    type: str = "fixed"
    """fixed | adaptive (Ziegler et al. 2019 proportional controller)."""
    kl_coef: float = bounded(0.001, ge=0, fix="use e.g. 0.001")
    """Initial (fixed: constant) coefficient beta of the KL penalty."""
    horizon: int = bounded(10000, ge=1, fix="use e.g. 10000")
    """Adaptive controller horizon (samples)."""
    target_kl: float = bounded(0.1, gt=0, fix="use e.g. 0.1")
    """Adaptive controller target KL."""


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (veRL ``algorithm.filter_groups.*``): groups whose metric is the same for
    every response are dropped and more prompts generated until the batch is full."""

    enable: bool = False
    """Drop the groups (responses to one prompt) whose ``metric`` does not vary, and refill the batch."""
    metric: Optional[str] = None
    """What must vary within a group: acc or score (a key the scorer returns; the score itself when it
    returns a number), seq_reward (summed token scores) or seq_final_reward (summed token rewards)."""
    max_num_gen_batches: int = 0
    """Most generation batches per training step (0 = no bound); past it the batch is completed with
    the last dropped groups (zero advantage) and ``train/filter_groups/filled_groups`` counts them."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation and in-reward KL (veRL ``algorithm.*``)."""

    adv_estimator: str = "grpo"
    """Name in the advantage-estimator registry (``--help`` lists the registered ones and what each
    needs; ``@hybrid_rl.algorithms.register_adv_est`` adds one)."""
    gamma: float = bounded(1.0, ge=0, le=1, fix="use e.g. 1.0")
    """Discount factor (GAE / returns)."""
    lam: float = bounded(1.0, ge=0, le=1, fix="use e.g. 0.95")
    """GAE lambda."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO: divide the group-centred score by the group std (False = Dr. GRPO)."""
    use_kl_in_reward: bool = False
    """Subtract beta * KL(actor || ref) from the token-level rewards."""
    kl_penalty: str = "kl"
    """KL estimator used in the reward: kl (k1) | abs | mse (k2) | low_var_kl (k3) | full."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """Controller of the in-reward KL coefficient."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling."""
    gdpo_reward_keys: Optional[list[str]] = None
    """gdpo estimator: the reward components, i.e. keys of the dict the scorer returns (each becomes
    a column beside the score), normalised per group one by one."""
    gdpo_reward_weights: Optional[list[float]] = None
    """gdpo estimator: one weight per component (null = 1 each)."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Correcting the rollout engine's log-probs against the trainer's (importance weights, rejection
    sampling, bypass mode): docs/algorithms.md."""


@dataclass
class CustomRewardFunctionConfig:
    """A user scoring function loaded from a Python file (veRL ``custom_reward_function.*``)."""

    path: Optional[str] = None
    """Python file defining the function; null = the built-in scorers by data_source."""
    name: str = "compute_score"
    """Function name in that file: ``fn(data_source, solution_str, ground_truth, extra_info)``."""


@dataclass
class RewardModelModelConfig:
    """The learned reward model (veRL ``reward_model.model.*``)."""

    path: Optional[str] = None
    """HF folder of a reward model (``AutoModelForSequenceClassification`` layout: a ``main_rm`` export,
    a TRL or OpenRLHF reward model), or the ``http(s)://`` URL of a remote reward service."""
    input_tokenizer: Optional[str] = None
    """The policy's tokenizer, which decodes the responses before the reward model's own chat template
    renders them (veRL's key); null = the actor's."""
    trust_remote_code: bool = False
    """Allow custom model code in the reward model's folder."""
    use_remove_padding: bool = True
    """Pack the valid tokens of a micro-batch instead of running on padding."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding and compute dtype; ``param_offload`` keeps it on CPU between uses on GPU."""

    def as_critic_model(self) -> CriticModelConfig:
        """The value-model config the reward-model worker is built from."""
        return CriticModelConfig(path=self.path, trust_remote_code=self.trust_remote_code,
                                 use_remove_padding=self.use_remove_padding, fsdp_config=self.fsdp_config)


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment (veRL ``reward_model.overlong_buffer.*``)."""

    enable: bool = False
    """Penalise responses longer than ``data.max_response_length - len`` tokens, linearly."""
    len: int = bounded(0, ge=0, fix="use e.g. a quarter of data.max_response_length")
    """Length of the ramp: the penalty grows from 0 at ``max_response_length - len`` tokens."""
    penalty_factor: float = bounded(1.0, ge=0, fix="use 1.0 (DAPO's)")
    """The penalty at ``data.max_response_length`` tokens."""
    log: bool = False
    """Also log the penalty and the share of penalised responses per step (``reward/overlong_*``)."""


@dataclass
class RewardModelConfig:
    """How rewards are computed (veRL ``reward_model.*``): rule / function scorers, and optionally a
    learned reward model (``enable``) whose score is combined with them (docs/rlhf_pipeline.md)."""

    enable: bool = False
    """Score responses with the learned reward model at ``model.path`` (a colocated worker, or a remote
    service when it is a URL)."""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """The reward model, its tokenizer and its sharding."""
    micro_batch_size_per_gpu: int = bounded(8, ge=1, fix="use e.g. 8")
    """Sequences per reward-model forward on one worker (rows per request for a remote service)."""
    max_length: Optional[int] = bounded(None, ge=2, fix="use null (no limit) or e.g. 2048")
    """Most tokens of one rendered conversation; longer ones keep their end (where the score is read).
    null = no limit."""
    normalize: Optional[bool] = None
    """Score as trained: ``(score - mean) / std`` with the ``mean`` / ``std`` saved in the reward
    model's config (``main_rm`` writes them; OpenRLHF's ``--normalize_reward``). null = when present."""
    rm_weight: float = 1.0
    """reward = rm_weight x (normalised) reward-model score + rule_weight x rule score."""
    rule_weight: float = 0.0
    """Weight of the rule / function scorer's score (0 = the reward model alone; it is still computed
    and logged beside the reward model's when the data has a rule scorer, so reward hacking shows)."""
    reward_manager: str = "naive"
    """naive (one call per sample) | batch (one call per batch) | any registered manager."""
    timeout: float = bounded(10.0, gt=0, fix="use e.g. 10 seconds")
    """Seconds one scoring call may take before it is abandoned and scored 0."""
    num_workers: int = bounded(1, ge=1, fix="use 1 (one after another) or more")
    """Scoring at once (veRL's ``reward.num_workers``, 8 there): the ``naive`` manager scores this many
    shares of the batch in parallel (each its own guarded runner and thread, each row its own
    ``timeout``), and a remote reward model gets this many requests in flight. Raise it for a
    latency-bound scorer (a remote judge, a sandbox); 1 = one after another."""
    num_examine: int = bounded(1, ge=0, fix="use 0 (none) or e.g. 1")
    """Decoded samples per data_source written to the log at each training step."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's soft overlong punishment, added to every scorer's score."""
    tool_reward_weight: float = 0.0
    """Multi-turn rollouts: a row's score becomes score + tool_reward_weight x (sum of its tool
    rewards and interaction turn scores). 0 = the final reward only (hybrid_rl's own key; veRL leaves
    the combination to a custom scorer, which also receives them in extra_info)."""


@dataclass
class RayInitConfig:
    """Arguments of ``ray.init`` (veRL ``ray_init.*``)."""

    num_cpus: Optional[int] = bounded(None, ge=1, fix="use null (all cores) or a core count")
    """CPUs Ray may schedule; null = all cores of the machine."""
    address: Optional[str] = None
    """Address of an existing Ray cluster; null starts a local one."""


@dataclass
class BaseTrainerConfig:
    """Run length, devices, logging, validation and checkpoints (veRL ``trainer.*``): the keys of the
    trainer core, which every mode has."""

    total_epochs: int = bounded(100, ge=1, fix="use 1 or more")
    """Passes over the training prompts (the run stops earlier at total_training_steps)."""
    total_training_steps: Optional[int] = bounded(4, ge=1, fix="use a number of steps, or null")
    """Stop after this many steps; null = total_epochs * steps per epoch."""
    project_name: str = "hybrid_rl"
    """Project name for trackers and the checkpoint folder."""
    experiment_name: str = "arithmetic_grpo"
    """Run name for trackers and the checkpoint folder."""
    logger: Any = field(default_factory=lambda: ["console", "jsonl"])
    """Trackers: a list of console, jsonl, tensorboard, wandb, mlflow, swanlab, or one name as a
    string (``trainer.logger=console``, as veRL accepts)."""
    log_val_generations: int = bounded(3, ge=0, fix="use 0 (none) or e.g. 3")
    """Decoded validation samples (prompt, response, score) logged at each validation."""
    nnodes: int = bounded(1, ge=1, fix="use 1 or more")
    """Number of machines."""
    n_gpus_per_node: int = bounded(1, ge=1, fix="use 1 or more")
    """Workers per machine: GPUs on GPU; worker processes on CPU (cores are split among them)."""
    device: str = "auto"
    """auto | cpu | cuda. auto = cuda when available, else cpu."""
    cpu_allocator: str = "auto"
    """Memory allocator of CPU worker processes: auto | glibc | jemalloc. glibc (tuned to keep freed
    memory for reuse) holds the process at its peak. jemalloc (the copy Ray ships) returns the free
    pages at the end of every worker phase: the tree's peak is 0.8-1.5 GiB lower (bench_step 5.0 ->
    4.2, the default run 6.3 -> 4.8 GiB in one process) at the same step time within the noise.
    auto = jemalloc where Ray's copy is found (Linux), else glibc. A MALLOC_* or LD_PRELOAD variable
    set by the user is passed on instead (hybrid_rl/utils/cpu_env.py, docs/memory.md)."""
    single_process: Optional[bool] = None
    """Host the one CPU worker in the driver's process instead of a Ray actor: no Ray cluster and one
    copy of the libraries, about 1 GiB less memory, the same results. null (auto) = true for
    command-line runs (main_ppo, main_sft, main_rm) of one CPU worker without ray_init.address,
    async_training, max_restarts or worker_call_timeout_s (which need Ray); false from a notebook's run_ppo, whose
    process outlives the run (hybrid_rl/trainer/core/single_process.py, docs/memory.md)."""
    save_freq: int = bounded(10, ge=-1, fix="use a positive number of steps or -1 (never)")
    """Save a checkpoint every N steps (and at the last step); -1 = never."""
    test_freq: int = bounded(2, ge=-1, fix="use a positive number of steps or -1 (never)")
    """Validate every N steps; -1 = only before training (if val_before_train) and at the end."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_at_end: bool = True
    """Validate after the last step."""
    resume_mode: str = "auto"
    """auto (resume from the latest checkpoint if any) | disable | resume_path."""
    resume_from_path: Optional[str] = None
    """global_step_N folder to resume from when resume_mode=resume_path."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Run folder: checkpoints, metrics.jsonl and the end-of-run plot."""
    max_actor_ckpt_to_keep: Optional[int] = bounded(2, ge=1, fix="use e.g. 2, or null (keep all)")
    """Keep only the N newest global_step_* checkpoints; null = keep all."""
    seed: int = 42
    """Seed of the driver RNG and the workers' sampling."""
    worker_call_timeout_s: Optional[float] = bounded(None, gt=0, fix="use null (wait) or e.g. 600")
    """Seconds one worker call (generate, update, ...) may take; past it the driver names the silent
    worker and call and stops. null = wait as long as the workers are alive (a dead worker is always
    reported at once)."""
    max_restarts: int = bounded(0, ge=0, fix="use 0 (no automatic restart) or e.g. 3")
    """Worker failures (a dead worker, or a call past worker_call_timeout_s) survived in one run: the
    driver stops the worker group, starts a new one and resumes from the last complete checkpoint
    (AReaL's recover mode). 0 = exit non-zero at the first failure."""
    max_consecutive_skipped_updates: Optional[int] = bounded(3, ge=1, fix="use e.g. 3, or null (never stop)")
    """Stop with an error after this many consecutive steps whose actor/critic update skipped an
    optimizer step for a non-finite loss or gradient norm. null = never stop."""
    progress_bar: bool = True
    """Show a tqdm progress bar (step, ETA, latest reward) on the driver."""
    plot: bool = True
    """Write reward_curve.png (reward and validation score per step) into the run folder."""
    check_batch: bool = False
    """Check the batch at every step boundary against the steps' declared keys (what a step reads
    before it, what it writes after it, no key outside hybrid_rl/schema.py); tens of microseconds a
    step. ``HYBRID_RL_CHECK_BATCH=1`` turns it on too (the tests set it). Not a veRL key."""
    use_legacy_worker_impl: str = "auto"
    """veRL's worker-implementation switch: auto | enable (veRL's FSDP workers, which hybrid_rl's
    workers follow). disable (veRL's new engine workers) is refused: hybrid_rl has one implementation."""
    log_level: str = "info"
    """info: the console shows hybrid_rl's lines, the progress bar, warnings and errors; vLLM, Ray and
    transformers below WARNING and their known-harmless warnings go only to the per-process files in
    ``<default_local_dir>/logs/``. debug: everything on the console. ``HYBRID_RL_LOG_LEVEL`` overrides."""


@dataclass
class TrainerConfig(BaseTrainerConfig):
    """The RL trainer's ``trainer.*``: the core's keys and the ones only RL reads."""

    max_critic_ckpt_to_keep: Optional[int] = None
    """Accepted for veRL compatibility; must be null or equal to max_actor_ckpt_to_keep
    (actor and critic are saved in the same step folder)."""
    critic_warmup: int = bounded(0, ge=0, fix="use 0 or a number of steps")
    """Steps during which only the critic is trained."""
    max_consecutive_reward_failures: Optional[int] = bounded(3, ge=1, fix="use e.g. 3, or null (never stop)")
    """Stop with an error after this many consecutive steps in which *every* sample's reward failed
    (raised, timed out or was not a number): the scorer is broken, not the model. null = never stop."""
    rollout_data_dir: Optional[str] = None
    """Folder for veRL's ``{step}.jsonl`` of the training rows and our sidecar (docs/observability.md); null = off."""
    validation_data_dir: Optional[str] = None
    """Folder for the validation rows in the same layout (``0.jsonl``: before training); null = off."""
    dump_max_rows_per_step: Optional[int] = bounded(None, ge=1, fix="use e.g. 64, or null (every row)")
    """Dump only the first N rows of a step (whole groups when N is a multiple of rollout.n); null = all."""
    dump_gzip: bool = False
    """Write the dumps as ``{step}.jsonl.gz`` / ``{step}.sidecar.jsonl.gz``; false = veRL's plain ``.jsonl``."""
    dump_replay_batch: bool = False
    """With ``rollout_data_dir``: also write each step's whole padded batch (``{step}.batch.pt``, every row)
    and ``meta.json`` (config, device, code commit), what ``python -m hybrid_rl.debug replay`` needs."""


@dataclass
class RolloutPoolConfig:
    """The rollout workers' own resource pool in the decoupled mode (veRL's fully-async
    ``rollout.nnodes`` / ``rollout.n_gpus_per_node``); unused in the colocated mode."""

    nnodes: int = bounded(1, ge=1, fix="use 1 or more")
    """Nodes of the rollout pool."""
    n_gpus_per_node: int = bounded(1, ge=1, fix="use 1 or more")
    """Rollout workers per node (processes on CPU, GPUs on GPU)."""


@dataclass
class AsyncTrainingConfig:
    """The decoupled (asynchronous) mode: rollout workers in their own pool produce scored
    experiences into a buffer while the trainer consumes them (docs/async.md has the mapping to
    veRL's, AReaL's and Trinity-RFT's names)."""

    enable: bool = False
    """true: decoupled mode (rollout pool ``rollout.*`` + training pool ``trainer.nnodes/n_gpus_per_node``);
    false: the colocated synchronous mode."""
    max_head_offpolicyness: int = bounded(1, ge=0, fix="use 0 (synchronous order) or 1-2")
    """AReaL's eta: the most policy versions a trained sample may lag the trainer. The rollout waits
    rather than run further ahead; buffered samples older than this are dropped (counted, kept in
    the buffer as ``dropped``, not regenerated). 0 = synchronous order."""
    trigger_parameter_sync_step: int = bounded(1, ge=1, fix="use 1 (every update) or more")
    """veRL's name (Trinity-RFT: ``synchronizer.sync_interval``): push the weights to the rollout
    pool every this many trainer updates; must be <= max_head_offpolicyness + 1."""
    partial_rollout: bool = True
    """veRL fully-async's name and default. true: the rollout streams groups (one prompt's ``rollout.n`` rows)
    into the buffer as each finishes, and a weight update interrupts the requests in flight, which continue from
    the tokens already sampled with the new weights; every token keeps the version and log-prob that sampled it
    (``rollout_versions``, ``rollout_log_probs``; needs ``rollout.calculate_log_probs=true``). Streamed requests
    carry no per-call seed and weight loads land between engine steps, so two runs of one seed may differ.
    false: one prompt batch per engine call (a weight update waits for the batch); seeded runs reproduce, and
    at eta 0 the run equals the synchronous run bit for bit."""
    buffer: BufferConfig = field(default_factory=BufferConfig)
    """Where experiences wait between the rollout and the trainer (memory or sql)."""
    weight_transport: str = "auto"
    """How a weight push travels from the trainer to the rollout pool (docs/async.md, "Weight transfer"):
    ``auto`` (shared-memory buckets when every rollout worker shares the trainer's node, Ray's object store
    otherwise), or force ``shm`` / ``object_store``. veRL's counterpart is ``rollout.checkpoint_engine.backend``,
    whose NCCL / NIXL backends are GPU-only."""
    update_weights_bucket_megabytes: int = bounded(DEFAULT_BUCKET_BYTES >> 20, ge=1, fix="use e.g. 512 (veRL's default)")
    """veRL's name (``rollout.checkpoint_engine.update_weights_bucket_megabytes``): MiB per weight bucket of a
    push; a tensor larger than a bucket gets a bucket of its own."""

    def __post_init__(self) -> None:
        transports = ("auto",) + TRANSPORTS
        if self.weight_transport not in transports:
            raise ValueError(f"async_training.weight_transport={self.weight_transport!r} is invalid: must be one of "
                             f"{transports}. Fix: use auto (shm on one node, the object store across nodes).")
        size = self.update_weights_bucket_megabytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"async_training.update_weights_bucket_megabytes={size!r} is invalid: must be an integer "
                             ">= 1 (MiB per weight bucket). Fix: use e.g. 512 (veRL's default).")


LINKED_DEFAULTS: dict[str, str] = {
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.response_length": "data.max_response_length",
    "actor_rollout_ref.rollout.prompt_length": "data.max_prompt_length",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.seed": "trainer.seed",
    "critic.model.path": "actor_rollout_ref.model.path",
    "critic.rollout_n": "actor_rollout_ref.rollout.n",
    "critic.ppo_mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size",
}
"""``key -> the key it follows`` in a composed run unless the key is set itself (veRL writes these as
``${...}`` interpolations in its YAML). The group's own dataclass, built alone, holds the value the
followed key has by default (a test keeps them equal)."""

_Group = TypeVar("_Group")


def key_owner(config: Any, key: str) -> tuple[Any, str]:
    """``(the dataclass holding the dotted ``key`` relative to ``config``, the field's name)``."""
    *parents, leaf = key.split(".")
    for part in parents:
        config = getattr(config, part)
    return config, leaf


def linked_group(group: str, factory: Callable[[], _Group],
                 links: Optional[dict[str, str]] = None) -> Callable[[], _Group]:
    """A default factory for ``group`` whose linked keys (``links``, default :data:`LINKED_DEFAULTS`)
    hold their ``${...}`` interpolation (resolved by OmegaConf when the config is made typed:
    :func:`hybrid_rl.trainer.config.loader.to_typed_config`)."""

    def make() -> _Group:
        node = factory()
        for key, target in (LINKED_DEFAULTS if links is None else links).items():
            head, _, rest = key.partition(".")
            if head != group:
                continue
            owner, leaf = key_owner(node, rest)
            # after the group's own checks ran on the plain default; the resolved copy is checked again
            object.__setattr__(owner, leaf, "${" + target + "}")
        return node

    return make


@dataclass
class PPOConfig:
    """The whole run. Groups mirror veRL's ``ppo_trainer.yaml``."""

    data: DataConfig = field(default_factory=DataConfig)
    """Datasets and batch sizes."""
    actor_rollout_ref: ActorRolloutRefConfig = field(
        default_factory=linked_group("actor_rollout_ref", ActorRolloutRefConfig))
    """Model, actor optimisation, reference policy and rollout engine (workers' config)."""
    critic: CriticConfig = field(default_factory=linked_group("critic", CriticConfig))
    """Value model (used by GAE)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator and in-reward KL."""
    custom_reward_function: CustomRewardFunctionConfig = field(
        default_factory=CustomRewardFunctionConfig
    )
    """User scoring function."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward manager settings."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run length, devices, logging, checkpoints."""
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """ray.init arguments."""
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)
    """The rollout pool of the decoupled mode."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """The decoupled (asynchronous) mode."""
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    """On-policy distillation: teacher models score the student's samples (veRL 0.9's keys)."""

    def own_pools(self) -> list[str]:
        """The worker pools this run reserves beside the training group, each named with its key (the
        trainer core's single-process choice reads this method of any mode's config)."""
        pools = ["a separate rollout pool (async_training.enable)"] if self.async_training.enable else []
        if self.distillation.pool_size:
            pools.append(f"the teachers' own pool (distillation.nnodes={self.distillation.nnodes})")
        return pools
