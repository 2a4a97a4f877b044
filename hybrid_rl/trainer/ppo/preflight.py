"""Driver-side checks that need the built components (datasets, reward registry), run before Ray starts.

:func:`hybrid_rl.trainer.config.checks.validate_config` checks the config alone; the checks here look at
what the config produced, so a mistake that would otherwise surface only at the first reward
computation (after the workers loaded their models) fails in a second, with one line naming the
file and the fix.
"""

from __future__ import annotations

from typing import Any, Iterable

from hybrid_rl.trainer.config import PPOConfig

__all__ = ["check_agent_config", "check_agent_names", "check_experience_buffer", "check_reward_coverage",
           "check_teacher_keys"]


def check_experience_buffer(cfg: PPOConfig, run_dir: str) -> None:
    """With the decoupled mode's sql buffer: connect to its database, create or verify the table and
    check that this user can write it (:func:`hybrid_rl.buffer.check.open_checked`), so that a wrong
    URL, password or permission is one line naming ``async_training.buffer.path`` before Ray and the
    workers start, not a traceback after them."""
    a = cfg.async_training
    if not a.enable or a.buffer.storage_type != "sql":
        return
    from hybrid_rl.buffer import sql_location
    from hybrid_rl.buffer.check import open_checked

    open_checked(*sql_location(a.buffer, run_dir, cfg.trainer.experiment_name)).close()


def check_agent_config(cfg: PPOConfig, tokenizer: Any) -> None:
    """Load the agent-loop YAML (its classes import) and check the default loop's name; with
    ``rollout.multi_turn.enable``: build the tools and interactions (their YAML, classes and schemas) and
    check that the tokenizer's chat template can render observation turns. Here in the driver, so a
    mistake is one line before any worker starts."""
    rollout = cfg.actor_rollout_ref.rollout
    multi_turn, agent = rollout.multi_turn, rollout.agent
    if agent.agent_loop_config_path:
        from hybrid_rl.agents.agent_loop import DictConfigWrap, check_agent_loops, load_agent_loop_config
        from hybrid_rl.workers.rollout.multi_turn import rollout_config_tree

        loops = load_agent_loop_config(agent.agent_loop_config_path)
        check_agent_loops(loops, DictConfigWrap(rollout_config_tree(rollout)), tokenizer)
    if agent.default_agent_loop:
        from hybrid_rl.workers.rollout.multi_turn import check_agent_name

        check_agent_name(agent.default_agent_loop, "actor_rollout_ref.rollout.agent.default_agent_loop")
    if not multi_turn.enable:
        return
    from hybrid_rl.agents import load_interactions, load_tools
    from hybrid_rl.agents.chat import ObservationEncoder

    tools = load_tools(multi_turn.tool_config_path) if multi_turn.tool_config_path else {}
    interactions = load_interactions(multi_turn.interaction_config_path) if multi_turn.interaction_config_path else {}
    encoder = ObservationEncoder(tokenizer, getattr(tokenizer, "eos_token", None) or "")
    encoder.check_roles((["tool"] if tools else []) + (["user"] if interactions else []))


def check_agent_names(cfg: PPOConfig, *datasets: Any) -> None:
    """With agent loops on: every ``agent_name`` of the datasets names a built-in or registered loop
    (one line naming the file and the known names), before any worker starts."""
    from hybrid_rl.agents.config import agent_rollout_enabled

    if not agent_rollout_enabled(cfg.actor_rollout_ref.rollout):
        return
    from hybrid_rl.workers.rollout.multi_turn import check_agent_name

    for dataset, where in zip(datasets, _describe_files(cfg)):
        for name in getattr(dataset, "agent_names", lambda: [])():
            try:
                check_agent_name(name, "agent_name")
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None


def check_reward_coverage(cfg: PPOConfig, *datasets: Any) -> None:
    """Raise ValueError if a dataset holds a ``data_source`` that no scorer handles.

    A custom reward function (``custom_reward_function.path``) scores every source, so nothing is
    checked then; nor for datasets that cannot list their sources (not an ``RLHFDataset``).
    """
    from hybrid_rl.agents.config import agent_rollout_enabled
    from hybrid_rl.reward import check_data_sources

    if cfg.custom_reward_function.path or cfg.data.reward_fn_key != "data_source":
        return
    agents_on = agent_rollout_enabled(cfg.actor_rollout_ref.rollout)
    for dataset, where in zip(datasets, _describe_files(cfg)):
        if not hasattr(dataset, "data_sources"):
            continue
        sources = dataset.data_sources(scored_only=True)
        agent_rows = agents_on or bool(getattr(dataset, "agent_names", list)())
        try:
            check_data_sources(sources, agent_rows=agent_rows)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None


def check_teacher_keys(cfg: PPOConfig, *datasets: Any) -> None:
    """With several distillation teachers: every row of the datasets has the ``distillation.teacher_key``
    field and its value is some teacher's ``key`` (one line naming the file and row, the value and the
    teachers), before Ray starts. In the workers such a row would stop only the ranks that hold it
    (:func:`hybrid_rl.workers.teacher.route_rows`). Pass the training set: validation batches are
    never scored by a teacher, so their rows may hold other values."""
    d = cfg.distillation
    teachers = d.active_teachers() if d.enabled else {}
    if len(teachers) < 2:  # one teacher scores every row
        return
    keys = {str(t.key) for t in teachers.values()}
    named = ", ".join(f"{name} (key {t.key!r})" for name, t in teachers.items())
    for dataset, where in zip(datasets, _describe_files(cfg)):
        for value in _field_values(dataset, d.teacher_key, where):
            if value not in keys:
                raise ValueError(
                    f"{_row_with(dataset, d.teacher_key, value, where)}: distillation.teacher_key {d.teacher_key}="
                    f"{value!r} matches no teacher (teachers: {named}); fix the row's {d.teacher_key}, or add a "
                    f"teacher for it: +distillation.teacher_models.<name>={{model_path:<folder>,key:{value}}}")


def _field_values(dataset: Any, field: str, where: str) -> Iterable[str]:
    """The distinct values (as ``str``, as the workers compare them) of ``field`` in the dataset's items."""
    if field == "data_source" and hasattr(dataset, "data_sources"):
        return [str(v) for v in dataset.data_sources()]
    values: dict[str, None] = {}
    for i in range(len(dataset)):
        item = dataset[i]
        if field not in item:
            raise ValueError(f"{where}: distillation.teacher_key={field!r}: the rows have no such field (they have "
                             f"{sorted(k for k in item if k not in ('input_ids', 'attention_mask'))}); set it to the "
                             "field that names each row's teacher")
        values.setdefault(str(item[field]))
    return list(values)


def _row_with(dataset: Any, field: str, value: str, where: str) -> str:
    """``data file '<path>' row N`` of the first row whose ``field`` is ``value`` (numbered as every data
    message: a JSON Lines row by its line), or ``where`` when the files do not hold the field."""
    from hybrid_rl.data.files import iter_records

    for path in getattr(dataset, "data_files", None) or []:
        for number, row in iter_records(path):
            if isinstance(row, dict) and field in row and str(row[field]) == value:
                return f"data file {path!r} row {number}"
    return where


def _describe_files(cfg: PPOConfig) -> Iterable[str]:
    if cfg.data.train_files is None:
        return ("the built-in arithmetic training set", "the built-in arithmetic test set")
    return (f"data.train_files={cfg.data.train_files!r}", f"data.val_files={cfg.data.val_files!r}")
