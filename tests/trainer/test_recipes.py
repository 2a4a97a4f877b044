"""Every recipe's overrides compose into a valid typed config (catches a renamed or misspelt key)."""

import glob
import os
import re
import shlex

import pytest

from hybrid_rl.trainer.config.loader import PPO_SCHEMA, RM_SCHEMA, SFT_SCHEMA, get_config, to_typed_config
from hybrid_rl.trainer.dpo.config import DPO_SCHEMA

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
RECIPES = sorted(glob.glob(os.path.join(REPO, "recipes", "*", "run.sh")))


SCHEMAS = {f"hybrid_rl.trainer.{schema.module}": schema for schema in (SFT_SCHEMA, RM_SCHEMA, PPO_SCHEMA, DPO_SCHEMA)}
SCHEMAS["hybrid_rl.eval"] = PPO_SCHEMA  # its key=value arguments are the trainer's
ENTRIES = tuple(SCHEMAS)


def compose(entry: str, overrides: list[str]):
    """The typed config the entry point builds from ``overrides`` (each mode its own schema)."""
    schema = SCHEMAS[entry]
    return to_typed_config(get_config(overrides, schema), schema.node)


def recipe_commands(path: str) -> list[tuple[str, list[str]]]:
    """``(trainer module, its overrides)`` of each training command of a recipe
    (a pipeline recipe runs several), in script order; ``$VAR`` becomes a placeholder path. A line
    ``bash recipes/<name>/run.sh key=value ...`` runs that recipe's commands, its last one with the
    line's overrides appended (the recipes' ``"$@"``)."""
    text = open(path).read().replace("\\\n", " ")
    values = {"NGPUS": "2"}
    for name, default in re.findall(r'^(\w+)="\$\{\1:-([^}$]*)\}"', text, re.M):  # BATCH="${BATCH:-4}"
        values.setdefault(name, default)
    commands = []
    for line in text.splitlines():
        line = re.sub(r'"\$(\w+)(/[^"]*)?"', lambda m: values.get(m.group(1), f"/placeholder/{m.group(1)}") + (m.group(2) or ""),
                      line)
        called = re.match(r"\s*(?:exec\s+)?bash\s+(recipes/[\w.-]+/run\.sh)(\s|$)", line)
        if called:
            *earlier, (entry, overrides) = recipe_commands(os.path.join(REPO, called.group(1)))
            commands += [*earlier, (entry, overrides + [a for a in shlex.split(line[called.end():]) if "=" in a])]
            continue
        entry = next((e for e in ENTRIES if re.search(rf"python3? -m {re.escape(e)}(\s|$)", line)), None)
        if entry is not None:
            commands.append((entry, [a for a in shlex.split(line.split(entry, 1)[1]) if "=" in a]))
    return commands


def recipe_overrides(path: str) -> list[str]:
    """The overrides of a recipe's last training command."""
    return recipe_commands(path)[-1][1]


def test_there_are_three_recipes():
    names = {os.path.basename(os.path.dirname(p)) for p in RECIPES}
    assert {"arithmetic_grpo", "gsm8k_grpo", "gsm8k_ppo"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: os.path.basename(os.path.dirname(p)))
def test_recipe_composes(path):
    commands = recipe_commands(path)
    for entry, earlier in commands[:-1]:  # a pipeline's earlier stages
        compose(entry, earlier)
    entry, overrides = commands[-1]
    if entry == "hybrid_rl.eval":  # an evaluation recipe: the scorer that gives maj@k
        cfg = compose(entry, overrides)
        assert os.path.isfile(cfg.custom_reward_function.path) and path.endswith("eval_majority/run.sh")
        return
    # those two are the default run plus LoRA / plus the decoupled mode
    assert len(overrides) > (4 if "arithmetic_grpo_lora" in path or "async_arithmetic" in path
                             or "partial_rollout_arithmetic" in path else 7)
    cfg = compose(entry, overrides)
    if path.endswith("arithmetic_grpo/run.sh"):  # the default run: the recipe must equal the defaults
        assert cfg == compose(entry, [])
    elif "arithmetic_grpo_lora" in path:  # the default run with a LoRA actor
        assert cfg.actor_rollout_ref.model.lora_rank == 32 and cfg.trainer.device == "auto"
    elif "sft_arithmetic" in path:  # supervised fine-tuning through main_sft (its own config)
        from hybrid_rl.trainer.config.supervised import sft_actor_config

        actor = sft_actor_config(cfg).actor
        assert actor.objective == {"name": "nll"} and cfg.trainer.total_epochs == 2
        assert actor.ppo_mini_batch_size == cfg.data.train_batch_size == 16
        return
    elif "rm_arithmetic" in path:  # reward-model training through main_rm (its own config)
        from hybrid_rl.trainer.config.supervised import rm_critic_config

        worker = rm_critic_config(cfg)
        assert worker.ppo_mini_batch_size == cfg.data.train_batch_size == 16 and cfg.trainer.total_epochs == 2
        assert worker.model.path == cfg.model.partial_pretrain and worker.ppo_micro_batch_size_per_gpu == 8
        return
    elif "/dpo_arithmetic/" in path:  # SFT, then offline DPO from its export (main_dpo's own config)
        from hybrid_rl.trainer.dpo.config import dpo_actor_config

        assert [e.rsplit(".", 1)[1] for e, _ in commands] == ["main_sft", "main_dpo"]
        actor = dpo_actor_config(cfg).actor
        assert actor.objective["name"] == "dpo" and actor.ppo_mini_batch_size == 2 * cfg.data.train_batch_size == 32
        assert cfg.model.partial_pretrain.endswith("sft_hf") and cfg.trainer.total_training_steps == 12
        return
    elif "sft_rm_ppo" in path:  # SFT -> reward model -> GRPO with the reward model as the only reward
        assert [e.rsplit(".", 1)[1] for e, _ in commands] == ["main_sft", "main_rm", "main_ppo"]
        rm = cfg.reward_model
        assert rm.enable and rm.model.path.endswith("rm_hf") and rm.rule_weight == 0 and rm.rm_weight == 1
        assert cfg.actor_rollout_ref.model.path.endswith("sft_hf") and cfg.data.arithmetic.num_shots == 0
    elif "distill_arithmetic" in path:  # teacher = the default run; students: k3, + task, top-32, GRPO
        assert [e.rsplit(".", 1)[1] for e, _ in commands] == ["main_ppo"] * 5
        for _, student in commands[1:4]:
            d = compose("hybrid_rl.trainer.main_ppo", student).distillation
            assert d.enabled and d.teacher_models["teacher_model"].model_path.endswith("teacher_hf")
        assert d.distillation_loss.loss_mode == "forward_kl_topk" and d.distillation_loss.topk == 32
        assert cfg.trainer.device == "auto" and cfg.trainer.total_training_steps == 8 and not cfg.distillation.enabled
        assert cfg.data.train_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4  # small steps
        assert cfg.actor_rollout_ref.actor.optim.lr == 5e-6
    elif "partial_rollout_arithmetic" in path:  # the decoupled run, streaming groups with partial rollout
        assert cfg.async_training.enable and cfg.async_training.partial_rollout
        assert cfg.actor_rollout_ref.rollout.calculate_log_probs and cfg.trainer.device == "auto"
    elif "async_arithmetic" in path:  # the default run, decoupled
        assert cfg.async_training.enable and cfg.async_training.max_head_offpolicyness == 1
        assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "decoupled" and cfg.trainer.device == "auto"
    elif "dapo_arithmetic" in path:  # the default run with DAPO's pieces
        assert cfg.algorithm.filter_groups.enable and cfg.algorithm.filter_groups.metric == "acc"
        assert cfg.reward_model.overlong_buffer.enable and cfg.actor_rollout_ref.actor.clip_ratio_high == 0.28
        assert cfg.trainer.device == "auto"
    elif "calculator_agent" in path:  # the CPU agentic recipe
        rollout = cfg.actor_rollout_ref.rollout
        assert rollout.multi_turn.enable and rollout.multi_turn.tool_config_path.endswith("tools.yaml")
        assert cfg.trainer.device == "auto"
    elif "gsm8k_verl_tool" in path:  # veRL's tool YAML unchanged, CPU-sized
        assert cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path.endswith("gsm8k_tool_config.yaml")
        assert cfg.trainer.device == "auto"
    elif "calculator_openai" in path:  # the calculator task through the OpenAI-compatible endpoint
        from hybrid_rl.agents.agent_loop import load_agent_loop_config

        loops = load_agent_loop_config(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
        assert loops["calculator_openai"]["agent"] == "calculator_openai_agent.solve"
        assert cfg.trainer.device == "auto" and not cfg.actor_rollout_ref.rollout.multi_turn.enable
    elif "calculator_anthropic" in path:  # the calculator task, the agent an anthropic-client harness (/v1/messages)
        import importlib.util

        from hybrid_rl.agents.agent_loop import load_agent_loop_config
        from hybrid_rl.agents.anthropic_route import chat_messages
        from hybrid_rl.data.calculator import make_row

        loops = load_agent_loop_config(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
        assert loops["calculator_anthropic"]["agent"] == "calculator_anthropic_agent.solve"
        assert cfg.trainer.device == "auto" and not cfg.actor_rollout_ref.rollout.multi_turn.enable
        file = os.path.join(os.path.dirname(path), "calculator_anthropic_agent.py")
        spec = importlib.util.spec_from_file_location("calculator_anthropic_agent", file)
        agent = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(agent)
        prompt = make_row(317, 46, "test", 0, (12, 34))["prompt"]  # the model sees the openai recipe's prompt
        system, messages = agent.to_messages_api(prompt)
        assert [{k: v for k, v in m.items() if k != "tool_call_id"} for m in chat_messages(
            {"system": system, "messages": messages})] == prompt
    elif "guess_number_env" in path:  # the environment recipe: an EnvAgentLoop entry, CPU-sized
        from hybrid_rl.agents.agent_loop import load_agent_loop_config

        loops = load_agent_loop_config(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
        assert loops["guess_number"]["env"] == "guess_number" and cfg.trainer.device == "auto"
    elif "textarena_env" in path:  # a hub environment: TextArena's game through its adapter, CPU-sized
        from hybrid_rl.agents.agent_loop import load_agent_loop_config
        from hybrid_rl.agents.env import get_env_cls
        loops = load_agent_loop_config(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
        assert get_env_cls(loops["textarena"]["env"], "recipe").__name__ == "TextArenaEnv"
        assert cfg.trainer.device == "auto"
    elif "/reasoning_gym/" in path:  # a reasoning-gym task's rows, scored through the registry's prefix route
        from hybrid_rl.reward import get_reward_fn

        assert str(cfg.data.val_files).endswith("/test.parquet") and cfg.trainer.device == "auto"
        assert get_reward_fn("reasoning_gym/basic_arithmetic") is get_reward_fn("reasoning_gym/leg_counting")
    elif "verl_quickstart" in path:  # veRL's command verbatim, then the CPU-sized additions win
        assert cfg.algorithm.adv_estimator == "gae" and cfg.trainer.logger == "console"
        assert cfg.data.train_batch_size == 16 and cfg.actor_rollout_ref.rollout.name == "vllm"
    elif "online_dpo_arithmetic" in path:  # the default run with the dpo objective (more: test_online_dpo.py)
        assert cfg.actor_rollout_ref.actor.objective["name"] == "dpo" and cfg.trainer.device == "auto"
    else:
        assert cfg.trainer.device == "cuda" and cfg.actor_rollout_ref.rollout.name == "vllm"
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:  # its tools YAML loads
        from hybrid_rl.agents import load_tools

        assert load_tools(cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path)


def test_the_eval_recipes_scorer_returns_its_answer_for_the_vote():
    import importlib.util

    from hybrid_rl.trainer.core.val_metrics import sample_metrics

    file = os.path.join(os.path.dirname(RECIPES[0]), "..", "eval_majority", "answer_scorer.py")
    spec = importlib.util.spec_from_file_location("answer_scorer", file)
    scorer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scorer)
    results = [scorer.compute_score("arithmetic", text, "12") for text in ("#### 12", "#### 13", "no idea", "#### 12")]
    assert results[0] == {"score": 1.0, "acc": True, "pred": "12"} and results[1]["pred"] == "13"
    assert results[2] == {"score": 0.0, "acc": False, "pred": ""}
    m = sample_metrics(["arithmetic"] * 4, ["p"] * 4, {"acc": [r["acc"] for r in results]},
                       [r["pred"] for r in results])
    assert 0.5 < m["val-core/arithmetic/acc/maj@4/mean"] <= 1.0  # "12" is the most frequent answer
