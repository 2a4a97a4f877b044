"""Multi-turn generation for both engines: the agent loop around an engine's batched turn call.

An engine provides ``generate_turn(token_lists, max_tokens, params)`` (one continuation per row, in
one engine call); :class:`MultiTurnGenerator` runs :class:`hybrid_rl.agents.AgentLoop` with it and
turns the trajectories into the rollout batch. Layout (docs/agents.md):

* ``responses`` [B, R]: model turns and observations in order, right-padded;
* ``response_mask`` [B, R]: 1 on sampled tokens, 0 on observations and padding;
* ``attention_mask`` [B, L]: 1 on every real token (observations included), so the actor's forward
  sees the whole conversation while the loss, KL, entropy and GAE only count model tokens;
* non-tensor columns ``num_turns``, ``tool_rewards``, ``turn_scores`` and ``agent_metrics`` per row.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable, Optional

import numpy as np
import torch

from hybrid_rl.agents import AgentLoop, RowContext, Trajectory, load_interactions, load_tools
from hybrid_rl.agents.agent_loop import BUILTIN_AGENT_LOOPS, DictConfigWrap, agent_loop_names, load_agent_loop_config
from hybrid_rl.agents.agent_runner import AgentLoopContext, run_agent_loops
from hybrid_rl.agents.loop import END_REASONS, FAILURE_KINDS
from hybrid_rl.agents.server import TURN_SEED_STRIDE, BatchingServer
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout.params import GenerationParams
from hybrid_rl.workers.rollout.config import RolloutConfig

__all__ = ["MultiTurnGenerator", "TURN_SEED_STRIDE", "build_trajectory_output", "row_contexts"]

TurnFn = Callable[[list[list[int]], list[int], GenerationParams], list[tuple[list[int], list[float]]]]


def _object_column(values: list[Any]) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def row_contexts(non_tensor_batch: dict[str, np.ndarray], num_rows: int) -> list[RowContext]:
    """Per-row tool/interaction kwargs, messages and agent name from the batch's non-tensor columns."""
    extra = non_tensor_batch.get("extra_info", [None] * num_rows)
    messages = non_tensor_batch.get("raw_prompt", [None] * num_rows)
    agents = non_tensor_batch.get("agent_name", [None] * num_rows)
    rows = []
    for i in range(num_rows):
        info = extra[i] if isinstance(extra[i], dict) else {}
        rows.append(RowContext(tools_kwargs=dict(info.get("tools_kwargs") or {}),
                               interaction_kwargs=dict(info.get("interaction_kwargs") or {}),
                               messages=list(messages[i]) if isinstance(messages[i], (list, tuple, np.ndarray)) else [],
                               agent_name=agents[i]))
    return rows


def build_trajectory_output(prompts: DataProto, trajs: list[Trajectory], params: GenerationParams,
                            with_log_probs: bool, prompt_width: Optional[int] = None) -> DataProto:
    """The rollout batch of multi-turn trajectories (layout in the module docstring); prompts are
    left-padded to ``prompt_width`` (default: the batch's width)."""
    prompt_ids, prompt_mask, prompt_pos = _prompt_tensors(prompts, trajs, params.pad_token_id,
                                                          prompt_width)  # [B, P] each
    num_rows, resp_len = prompt_ids.shape[0], params.response_length
    responses = torch.full((num_rows, resp_len), params.pad_token_id, dtype=prompt_ids.dtype)  # [B, R]
    response_mask = torch.zeros((num_rows, resp_len), dtype=prompt_mask.dtype)  # [B, R]
    valid = torch.zeros((num_rows, resp_len), dtype=prompt_mask.dtype)  # [B, R]
    log_probs = torch.zeros((num_rows, resp_len), dtype=torch.float32)  # [B, R]
    for i, t in enumerate(trajs):
        n = len(t.response_ids)
        assert n <= resp_len, f"trajectory {i} has {n} response tokens > response_length {resp_len}"
        responses[i, :n] = torch.as_tensor(t.response_ids, dtype=prompt_ids.dtype)
        response_mask[i, :n] = torch.as_tensor(t.response_mask, dtype=prompt_mask.dtype)
        valid[i, :n] = 1
        log_probs[i, :n] = torch.as_tensor(t.log_probs, dtype=torch.float32)
    delta = torch.arange(1, resp_len + 1, dtype=prompt_pos.dtype)  # [R]
    tensors = {
        "prompts": prompt_ids, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),  # [B, L]
        "attention_mask": torch.cat([prompt_mask, valid], dim=1),  # [B, L]
        "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + delta], dim=1),  # [B, L]
    }
    if with_log_probs:
        tensors["rollout_log_probs"] = log_probs
    non_tensors = dict(prompts.non_tensor_batch)
    non_tensors.update(num_turns=_object_column([t.num_turns for t in trajs]),
                       tool_rewards=_object_column([list(t.tool_rewards) for t in trajs]),
                       turn_scores=_object_column([list(t.turn_scores) for t in trajs]),
                       agent_metrics=_object_column([_row_metrics(t) for t in trajs]))
    non_tensors["reward_score"] = _object_column([t.reward_score for t in trajs])
    non_tensors["agent_failure"] = _object_column([t.failure for t in trajs])
    return DataProto.from_dict(tensors, non_tensors=non_tensors, meta_info=dict(prompts.meta_info))


def _prompt_tensors(prompts: DataProto, trajs: list[Trajectory], pad_token_id: int,
                    width: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch's left-padded prompt ids, mask and positions, widened to [B, width]; rows whose
    trajectory starts from other prompt ids (a custom agent loop templated its own prompt) are re-padded."""
    ids, mask, pos = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    extra = max(0, (width or 0) - ids.shape[1])
    ids = torch.nn.functional.pad(ids, (extra, 0), value=pad_token_id)
    mask, pos = (torch.nn.functional.pad(t, (extra, 0), value=0) for t in (mask, pos))
    width = ids.shape[1]
    for i, t in enumerate(trajs):
        own = ids[i][mask[i].bool()].tolist()
        if t.prompt_ids == own:
            continue
        n = len(t.prompt_ids)
        assert n <= width, f"trajectory {i}: prompt of {n} tokens > the batch's prompt width {width}"
        ids[i] = pad_token_id
        ids[i, width - n:] = torch.as_tensor(t.prompt_ids, dtype=ids.dtype)
        mask[i] = 0
        mask[i, width - n:] = 1
        pos[i] = torch.clamp(torch.cumsum(mask[i], 0) - 1, min=0)
    return ids, mask, pos


def _row_metrics(t: Trajectory) -> dict[str, float]:
    return {**t.metrics(), **{f"ended_by/{r}": float(t.end_reason == r) for r in END_REASONS},
            **{f"failure/{k}": float(t.failure == k) for k in FAILURE_KINDS}}


def batch_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """``agent/*`` metrics of one call: means over rows, the observation-token fraction, end reasons."""
    if not trajs:
        return {}
    rows = [t.metrics() for t in trajs]
    # per-trajectory means (workers' values are averaged by the driver, so sums would under-count)
    out = {f"agent/{key}/mean": float(np.mean([r.get(key, 0.0) for r in rows]))
           for key in ("num_turns", "assistant_turns", "tool_calls", "tool_errors", "tool_timeouts")}
    obs, model = sum(r["observation_tokens"] for r in rows), sum(r["model_tokens"] for r in rows)
    out["agent/observation_token_fraction"] = obs / max(obs + model, 1.0)
    for key in sorted({k for r in rows for k in r if k.startswith(("tool/", "loop/"))}):
        out[f"agent/{key}"] = float(np.mean([r.get(key, 0.0) for r in rows]))  # a row without the call counts 0
    ends = Counter(t.end_reason for t in trajs)
    out.update({f"agent/ended_by/{r}": ends[r] / len(trajs) for r in END_REASONS})
    failures = Counter(t.failure for t in trajs)  # shares of rows, as ended_by (the driver averages workers)
    out.update({f"agent/failure/{k}": failures[k] / len(trajs) for k in FAILURE_KINDS})
    return out


class MultiTurnGenerator:
    """Builds the tools, interactions and agent loops once; :meth:`generate` runs one batch: rows of the
    built-in loops (``tool_agent``, ``single_turn_agent``) through the batched tool loop, rows naming a
    custom agent loop (docs/agents.md) as coroutines over a :class:`BatchingServer`."""

    def __init__(self, config: RolloutConfig, tokenizer: Any, eos_token_id: Any):
        cfg = config.multi_turn
        if config.tensor_model_parallel_size != 1:
            raise ValueError(f"rollout.multi_turn.enable=true with rollout.tensor_model_parallel_size="
                             f"{config.tensor_model_parallel_size} is not supported yet: the ranks of a "
                             "tensor-parallel group would run different turns. Fix: use tensor_model_parallel_size=1.")
        self.config = config
        self.tools = load_tools(cfg.tool_config_path) if cfg.tool_config_path else {}
        self.interactions = load_interactions(cfg.interaction_config_path) if cfg.interaction_config_path else {}
        if config.agent.agent_loop_config_path:
            load_agent_loop_config(config.agent.agent_loop_config_path)
        self.default_agent = config.agent.default_agent_loop or ("tool_agent" if cfg.enable else "single_turn_agent")
        check_agent_name(self.default_agent, "actor_rollout_ref.rollout.agent.default_agent_loop")
        eos = list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
        self._loops: dict[tuple[int, ...], AgentLoop] = {}
        self.tokenizer = tokenizer
        self._loop_for(tuple(int(e) for e in eos if e is not None))  # template / tokenizer problems fail at start

    def _loop_for(self, eos_token_ids: tuple[int, ...]) -> AgentLoop:
        if eos_token_ids not in self._loops:
            self._loops[eos_token_ids] = AgentLoop(self.config.multi_turn, self.tokenizer, self.tools,
                                                   self.interactions, list(eos_token_ids))
        return self._loops[eos_token_ids]

    def generate(self, prompts: DataProto, prompt_lists: list[list[int]], params: GenerationParams,
                 turn_fn: TurnFn) -> DataProto:
        """Trajectories for ``prompts`` (``prompt_lists``: their unpadded ids), one engine call per turn."""
        names = self._agent_names(prompts.non_tensor_batch, len(prompt_lists))
        custom = [i for i, name in enumerate(names) if name not in BUILTIN_AGENT_LOOPS]
        builtin = [i for i, name in enumerate(names) if name in BUILTIN_AGENT_LOOPS]
        per_row: list[list[Trajectory]] = [[] for _ in prompt_lists]
        if builtin:
            for i, t in zip(builtin, self._run_builtin(prompts, prompt_lists, builtin, names, params, turn_fn)):
                per_row[i] = [t]
        if custom:
            for i, ts in zip(custom, self._run_custom(prompts, prompt_lists, custom, names, params, turn_fn)):
                per_row[i] = ts
        if self.config.agent.rows == "every_call":
            prompts, per_row = expand_rollout_rows(prompts, per_row, bool(prompts.meta_info.get("validate")))
        trajs = [t for ts in per_row for t in ts]
        output = build_trajectory_output(prompts, trajs, params, self.config.calculate_log_probs,
                                         prompt_width=self._prompt_width(prompts))
        output.meta_info["metrics"] = {**output.meta_info.get("metrics", {}), **batch_metrics(trajs)}
        return output

    def _prompt_width(self, prompts: DataProto) -> int:
        """The batch's prompt width, or ``prompt_length`` when custom loops are registered: they may
        template longer prompts than the dataset's (and every worker's chunk must share one width)."""
        width = prompts.batch["input_ids"].shape[1]
        custom_loops = set(agent_loop_names()) - set(BUILTIN_AGENT_LOOPS)
        return max(width, self.config.prompt_length) if custom_loops else width

    def _agent_names(self, non_tensor_batch: dict[str, np.ndarray], num_rows: int) -> list[str]:
        column = non_tensor_batch.get("agent_name", [None] * num_rows)
        names = [str(name) if isinstance(name, str) and name else self.default_agent for name in column]
        known = set(agent_loop_names())
        for i, name in enumerate(names):
            if name not in known:
                check_agent_name(name, f"row {i}: agent_name")  # raises, naming the row
        return names

    def _run_builtin(self, prompts: DataProto, prompt_lists: list[list[int]], rows: list[int], names: list[str],
                     params: GenerationParams, turn_fn: TurnFn) -> list[Trajectory]:
        def generate_turn(token_lists: list[list[int]], max_tokens: list[int], turn: int):
            seed = None if params.seed is None else params.seed + turn * TURN_SEED_STRIDE
            return turn_fn(token_lists, max_tokens, dataclasses.replace(params, seed=seed))

        contexts = row_contexts(prompts.non_tensor_batch, len(prompt_lists))
        for i in rows:
            contexts[i].agent_name = names[i]
        return self._loop_for(tuple(params.eos_token_ids)).run(
            [prompt_lists[i] for i in rows], [contexts[i] for i in rows], generate_turn, budget=params.response_length)

    def _run_custom(self, prompts: DataProto, prompt_lists: list[list[int]], rows: list[int], names: list[str],
                    params: GenerationParams, turn_fn: TurnFn) -> list[list[Trajectory]]:
        agent = self.config.agent
        width = self._prompt_width(prompts)
        server = BatchingServer(turn_fn, params, max_model_len=width + params.response_length,
                                batch_window_s=agent.batch_window_s)
        ctx = AgentLoopContext(trainer_config=DictConfigWrap(rollout_config_tree(self.config)), tokenizer=self.tokenizer,
                               sampling_params=verl_sampling_params(params, self.config.calculate_log_probs),
                               timeout_s=agent.timeout_s, progress_interval_s=agent.progress_interval_s,
                               several_rows=agent.rows == "every_call")
        kwargs = [row_kwargs(prompts.non_tensor_batch, i) for i in rows]
        return run_agent_loops([names[i] for i in rows], kwargs, [prompt_lists[i] for i in rows], server, ctx,
                               budget=params.response_length, prompt_width=width)


def expand_rollout_rows(prompts: DataProto, per_row: list[list[Trajectory]],
                        validate: bool) -> tuple[DataProto, list[list[Trajectory]]]:
    """``agent.rows: every_call``: input row i's ``k_i`` trajectories become ``k_i`` rows, each a copy of
    the input row's columns with ``rollout_row`` (the input row it came from: the driver's batch index
    when it set one, else i) and ``rollout_rows`` (``k_i``). Validation keeps each rollout's first row, so
    held-out metrics count rollouts, not rows."""
    if validate:
        per_row = [ts[:1] for ts in per_row]
    origin = np.repeat(np.arange(len(per_row)), [len(ts) for ts in per_row])  # [B'] the input row of each row
    given = prompts.non_tensor_batch.get("rollout_row")
    rollout_row = np.asarray(given, dtype=object) if given is not None else _object_column(list(range(len(per_row))))
    expanded = prompts.select_idxs(origin)
    expanded.non_tensor_batch["rollout_row"] = rollout_row[origin]
    expanded.non_tensor_batch["rollout_rows"] = _object_column([len(per_row[i]) for i in origin])
    return expanded, per_row


def check_agent_name(name: str, where: str) -> None:
    """One-line ValueError unless ``name`` is a built-in or registered agent loop."""
    if name not in agent_loop_names():
        raise ValueError(f"{where}={name!r} is not an agent loop; known: {', '.join(agent_loop_names())}. Fix: "
                         "register it with @hybrid_rl.agents.register or list it in "
                         "actor_rollout_ref.rollout.agent.agent_loop_config_path.")


def row_kwargs(non_tensor_batch: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    """Row ``i``'s non-tensor columns as a custom loop's ``run`` receives them (veRL lifts
    ``tools_kwargs`` / ``interaction_kwargs`` out of ``extra_info``; so does this)."""
    kwargs = {k: v[i] for k, v in non_tensor_batch.items()}
    info = kwargs.get("extra_info") if isinstance(kwargs.get("extra_info"), dict) else {}
    for key in ("tools_kwargs", "interaction_kwargs"):
        kwargs.setdefault(key, info.get(key) or {})
    return kwargs


def rollout_config_tree(config: RolloutConfig) -> Any:
    """``actor_rollout_ref.rollout.*`` as an OmegaConf tree (what veRL loops read from ``self.config``)."""
    from omegaconf import OmegaConf

    return OmegaConf.create({"actor_rollout_ref": {"rollout": dataclasses.asdict(config)}})


def verl_sampling_params(params: GenerationParams, logprobs: bool) -> dict[str, Any]:
    """The ``sampling_params`` veRL passes to an agent loop's ``run``. A greedy call (validation's
    default ``do_sample=false``, ReMax's baseline) sends temperature 0, which the endpoint and the
    batching server read as greedy; the configured temperature would make the loop sample."""
    temperature = params.temperature if params.do_sample else 0.0
    return {"temperature": temperature, "top_p": params.top_p, "top_k": params.top_k,
            "repetition_penalty": 1.0, "logprobs": logprobs}
