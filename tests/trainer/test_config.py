"""Config composition (Hydra + typed schema) and the one-shot validation errors."""

import os

import pytest
from omegaconf import OmegaConf

from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.checks import make_run_plan, validate_config
from hybrid_rl.trainer.config.loader import CONFIG_DIR, get_config, to_ppo_config


@pytest.fixture(autouse=True)
def _fresh_working_dir(tmp_path, monkeypatch):
    """The default ``trainer.default_local_dir`` is relative: checkpoints of a default run made in
    the repo (README's first command) must not turn into resume errors here."""
    monkeypatch.chdir(tmp_path)


def _cfg(*overrides):
    return to_ppo_config(get_config(list(overrides)))


ETA0 = ["async_training.max_head_offpolicyness=0"]  # the decoupled mode without stale rows: no correction needed
BATCH_PATH = "async_training.partial_rollout=false"  # one prompt batch per engine call: no behaviour log-probs needed


def _flat_keys(node, prefix=""):
    keys = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            keys |= _flat_keys(value, path + ".")
        else:
            keys.add(path)
    return keys


def test_yaml_holds_no_defaults():
    """The dataclasses are the one source of defaults: the YAML carries Hydra's settings only, so no
    value can be written twice and drift."""
    raw = OmegaConf.to_container(OmegaConf.load(os.path.join(CONFIG_DIR, "ppo_trainer.yaml")), resolve=False)
    assert set(raw) == {"defaults", "hydra"}
    assert raw["defaults"][0] == "ppo_trainer_schema"


def _resolved(cfg):
    return OmegaConf.to_container(OmegaConf.structured(to_ppo_config(cfg)), resolve=True)


def test_python_and_command_line_defaults_are_one_job():
    """A notebook's PPOConfig() and the bare main_ppo command line resolve to the same config, and a
    trainer built from PPOConfig() holds it."""
    from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer

    assert _resolved(PPOConfig()) == _resolved(get_config([]))
    trainer = RayPPOTrainer(PPOConfig())
    assert _resolved(trainer.config) == _resolved(get_config([]))
    assert trainer.config.trainer.default_local_dir == "checkpoints/hybrid_rl/arithmetic_grpo"


def test_linked_keys_follow_in_python_as_on_the_command_line():
    from hybrid_rl.trainer.config import LINKED_DEFAULTS, DataConfig, TrainerConfig

    cfg = to_ppo_config(PPOConfig(data=DataConfig(max_response_length=32), trainer=TrainerConfig(seed=7)))
    assert cfg.actor_rollout_ref.rollout.response_length == 32 and cfg.actor_rollout_ref.rollout.seed == 7
    assert _cfg("data.max_response_length=32").actor_rollout_ref.rollout.response_length == 32
    assert _cfg("actor_rollout_ref.rollout.response_length=8").data.max_response_length == 16  # set: not linked
    assert len(LINKED_DEFAULTS) == 10


def test_a_group_built_alone_holds_its_linked_default():
    """Each linked key's own dataclass default is the followed key's default (or null = follow), so a
    worker config built outside a run matches the composed one."""
    from hybrid_rl.trainer.config import LINKED_DEFAULTS
    from hybrid_rl.workers.config import ActorRolloutRefConfig, CriticConfig

    resolved = _resolved(PPOConfig())
    alone = {"actor_rollout_ref": OmegaConf.to_container(OmegaConf.structured(ActorRolloutRefConfig())),
             "critic": OmegaConf.to_container(OmegaConf.structured(CriticConfig()))}
    for key, target in LINKED_DEFAULTS.items():
        value = alone
        for part in key.split("."):
            value = value[part]
        expected = resolved
        for part in target.split("."):
            expected = expected[part]
        assert value in (expected, None), key


def test_default_run_config():
    cfg = _cfg()
    validate_config(cfg)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.actor_rollout_ref.rollout.response_length == cfg.data.max_response_length == 16
    assert cfg.critic.rollout_n == 8 and cfg.data.train_files is None
    plan = make_run_plan(cfg)
    assert plan.world_size == 1 and not plan.use_critic and not plan.use_reference_policy
    assert plan.threads_per_worker == os.cpu_count()


def test_overrides_and_interpolations():
    cfg = _cfg("data.max_response_length=32", "actor_rollout_ref.rollout.n=4", "trainer.logger=[console]")
    assert cfg.actor_rollout_ref.rollout.response_length == 32
    assert cfg.critic.rollout_n == 4 and cfg.trainer.logger == ["console"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.train_batch_siz=4", "Did you mean 'data.train_batch_size'"),
        ("actor_rollout_ref.rolout.n=2", "Did you mean 'actor_rollout_ref.rollout.n'"),
        ("data.train_batch_size=abc", "data.train_batch_size"),
    ],
)
def test_unknown_keys_and_types_are_errors(override, message):
    with pytest.raises(ValueError, match=message):
        get_config([override])


def test_worker_group_checks_run_on_conversion():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _cfg("actor_rollout_ref.actor.clip_ratio_c=0.5")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.n_gpus_per_node=2", "data.train_batch_size=3", "actor_rollout_ref.rollout.n=3",
          "actor_rollout_ref.actor.ppo_mini_batch_size=3"], r"= 9 rows is not divisible by the 2 workers"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=5", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"], r"multiple of actor_rollout_ref.actor.ppo_mini_batch_size \(5\)"),
        (["actor_rollout_ref.actor.use_dynamic_bsz=false", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=48"], r"ppo_micro_batch_size_per_gpu \(48\) must divide the 128 rows"),
        (["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100"], r"ppo_max_token_len_per_gpu=100 is smaller than one row of up to 144 tokens"),
        (["actor_rollout_ref.rollout.n=1"], r"rollout.n=1; set rollout.n >= 2"),
        (["algorithm.adv_estimator=gae", "critic.model.path=/nonexistent/critic"], r"critic.model.path='/nonexistent/critic'"),
        (["algorithm.adv_estimator=nope"], r"algorithm.adv_estimator='nope' is not registered"),
        (["algorithm.kl_penalty=k9"], r"algorithm.kl_penalty='k9'"),
        (["data.train_files=/nonexistent/train.parquet"], r"data.train_files: file '/nonexistent/train.parquet' does not exist"),
        (["custom_reward_function.path=/nonexistent/reward.py"], r"custom_reward_function.path='/nonexistent/reward.py'"),
        (["trainer.logger=[console,wandbx]"], r"unknown tracker 'wandbx'"),
        (["trainer.critic_warmup=2"], r"trainer.critic_warmup=2 but algorithm.adv_estimator=grpo trains no critic"),
        (["trainer.resume_mode=resume_path"], r"needs trainer.resume_from_path"),
        (["trainer.resume_mode=latest"], r"trainer.resume_mode='latest'"),
        (["trainer.save_freq=0"], r"trainer.save_freq=0"),
        (["trainer.n_gpus_per_node=4"], r"n_gpus_per_node=4 CPU workers"),
        (["reward_model.enable=true"], r"reward_model.enable=true"),
        (["trainer.max_critic_ckpt_to_keep=5"], r"max_critic_ckpt_to_keep=5 differs"),
        (["actor_rollout_ref.rollout.response_length=8"], r"rollout.response_length=8 differs from data.max_response_length=16"),
        (["critic.rollout_n=2", "algorithm.adv_estimator=gae"], r"critic.rollout_n=2 differs"),
        (["trainer.device=tpu"], r"trainer.device='tpu'"),
        (["async_training.enable=true", "async_training.max_head_offpolicyness=0", BATCH_PATH,
          "async_training.trigger_parameter_sync_step=2"], r"trigger_parameter_sync_step=2 must be between 1 and"),
        (["async_training.enable=true", "async_training.max_head_offpolicyness=-1", BATCH_PATH], r"max_head_offpolicyness=-1"),
        (["algorithm.rollout_correction.rollout_is_threshold=inf"],
         r"^algorithm.rollout_correction.rollout_is_threshold=inf is invalid: must be finite numbers. Fix: use e.g. 2.0"),
        (["algorithm.rollout_correction.rollout_is_threshold='0.5_inf'"], r"rollout_is_threshold='0.5_inf' is invalid"),
        (["algorithm.rollout_correction.rollout_rs=seq_mean_k3", "algorithm.rollout_correction.rollout_rs_threshold=nan",
          "actor_rollout_ref.rollout.calculate_log_probs=true"], r"rollout_rs_threshold=nan is invalid: must be finite"),
        (["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[acc,format]", "algorithm.gdpo_reward_weights=[1,inf]"],
         r"^algorithm.gdpo_reward_weights=\[1.0, inf\] is invalid: must be finite numbers"),
        (["async_training.enable=true", *ETA0, BATCH_PATH, "rollout.n_gpus_per_node=0"], r"rollout.n_gpus_per_node=0"),
        (["async_training.enable=true", *ETA0, BATCH_PATH, "ray_init.num_cpus=2", "trainer.n_gpus_per_node=2"], r"sum to at most"),
        (["async_training.enable=true", *ETA0, BATCH_PATH, "algorithm.adv_estimator=remax"], r"remax generates a greedy baseline"),
        (["async_training.enable=true", *ETA0],  # partial rollout is the decoupled mode's default
         r"^async_training.partial_rollout=true samples one response with several policy versions"),
        (["async_training.enable=true", "ray_init.num_cpus=2", "trainer.n_gpus_per_node=1", BATCH_PATH],
         r"^async_training.max_head_offpolicyness=1 trains rows sampled by weights up to 1 version\(s\) old, but "
         r"actor_rollout_ref.actor.policy_loss.loss_mode=vanilla without a rollout correction .* Fix: set "
         r"actor_rollout_ref.actor.policy_loss.loss_mode=decoupled .*algorithm.rollout_correction.preset=token_tis"),
        (["async_training.enable=true", "async_training.max_head_offpolicyness=2", "ray_init.num_cpus=2",
          "trainer.n_gpus_per_node=1", "algorithm.rollout_correction.preset=metrics",
          "actor_rollout_ref.rollout.calculate_log_probs=true"], r"max_head_offpolicyness=2 trains rows"),
        (["async_training.enable=true", "actor_rollout_ref.actor.policy_loss.loss_mode=decoupled", BATCH_PATH],
         r"loss_mode=decoupled needs the behaviour log-probs"),
    ],
)
def test_each_inconsistency_is_one_error(overrides, message):
    cfg = _cfg(*overrides)
    with pytest.raises(ValueError, match=message) as info:
        validate_config(cfg)
    assert "config problems" not in str(info.value)  # exactly one problem reported


DECOUPLED = ["async_training.enable=true", "ray_init.num_cpus=2", "trainer.n_gpus_per_node=1"]
BEHAVIOUR = "actor_rollout_ref.rollout.calculate_log_probs=true"


@pytest.mark.parametrize("overrides", [
    [*ETA0, BATCH_PATH],
    ["async_training.max_head_offpolicyness=3", "async_training.trigger_parameter_sync_step=4",
     "actor_rollout_ref.actor.policy_loss.loss_mode=decoupled", BEHAVIOUR],
    ["algorithm.rollout_correction.preset=token_tis", BEHAVIOUR],
    ["algorithm.rollout_correction.rollout_rs=seq_mean_k3", "algorithm.rollout_correction.rollout_rs_threshold=0.01",
     BEHAVIOUR],
    ["algorithm.rollout_correction.bypass_mode=true", BEHAVIOUR],
    [*ETA0, "actor_rollout_ref.rollout.multi_turn.enable=true", BEHAVIOUR],
], ids=["eta0_batch_path", "decoupled_loss", "rollout_is", "rollout_rs", "bypass", "partial_builtin_tool_loop"])
def test_stale_rows_are_accepted_with_a_correction_or_without_staleness(overrides):
    """eta >= 1 needs the decoupled loss or a rollout correction (the vanilla loss alone trains stale
    rows as on-policy); each of these is one, and eta = 0 has no stale rows."""
    validate_config(_cfg(*DECOUPLED, *overrides))


def test_the_decoupled_loss_caps_the_behaviour_weight_by_default():
    """AReaL's 5: a null cap would let one very stale token weigh up to e^20."""
    cap = _cfg().actor_rollout_ref.actor.policy_loss.behav_imp_weight_cap
    assert cap == 5.0
    cfg = _cfg("actor_rollout_ref.actor.policy_loss.behav_imp_weight_cap=null")
    assert cfg.actor_rollout_ref.actor.policy_loss.behav_imp_weight_cap is None


def test_unknown_buffer_storage_is_one_line_naming_the_key():
    with pytest.raises(ValueError, match=r"async_training.buffer.storage_type='redis' is invalid.*Fix: use memory or sql"):
        validate_config(_cfg("async_training.enable=true", "async_training.buffer.storage_type=redis"))


def test_all_problems_reported_together():
    cfg = _cfg("actor_rollout_ref.rollout.n=1", "trainer.save_freq=0")
    with pytest.raises(ValueError, match="2 config problems") as info:
        validate_config(cfg)
    assert "rollout.n=1" in str(info.value) and "trainer.save_freq=0" in str(info.value)


def test_cuda_requested_without_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("machine has a GPU")
    with pytest.raises(ValueError, match="trainer.device=cuda but no CUDA device"):
        validate_config(_cfg("trainer.device=cuda"))


def test_validation_never_rewrites_the_config():
    cfg = _cfg()
    before = OmegaConf.to_container(OmegaConf.structured(cfg))
    validate_config(cfg)
    make_run_plan(cfg)
    assert OmegaConf.to_container(OmegaConf.structured(cfg)) == before
