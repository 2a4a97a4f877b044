"""``EnvAgentLoop``: multi-step episodes of a text environment, as an agent loop.

Configured as an entry of ``actor_rollout_ref.rollout.agent.agent_loop_config_path``::

    - name: guess_number                               # rows with agent_name: guess_number
      _target_: hybrid_rl.agents.env_loop.EnvAgentLoop
      env: guess_number                                # @register_env name or dotted class path
      env_kwargs: {low: 1, high: 16}                   # the environment's constructor arguments
      max_steps: 5                                     # most model turns (env steps) per episode
      gamma: 1.0                                       # discount of per-step rewards

Per row: ``extra_info.env_kwargs`` (merged over the entry's, the row's winning; ``seed`` and
``options`` go to ``reset`` instead, ``seed`` defaulting to ``extra_info.index``). The episode:

1. ``reset`` -> the first observation, appended to the row's chat messages as a user turn; the
   prompt is that conversation through the chat template (with the generation prompt);
2. the model's turn (its sampled ids, mask 1) is decoded and passed to ``step`` as the action;
3. the observation is appended as the template's delta for a new user turn plus the next assistant
   header (mask 0: never trained on), and the model goes again;
4. until the environment terminates or truncates, ``max_steps`` turns were taken, a turn ends
   without EOS, or the next observation would overrun ``response_length``.

The row's score is the discounted return ``sum_t gamma^t r_t`` (``reward_score``; rows marked
``reward_model.style: agent`` skip the reward function). Per-row metrics: ``agent/loop/env_steps``
(``step()`` calls), ``agent/loop/env_turns`` (model turns: one more than the steps when the last turn was
cut by the budget, so it had no action to apply), ``agent/loop/env_return``, ``agent/loop/env_terminated``.
"""

from __future__ import annotations

from typing import Any, Optional

from hybrid_rl.agents.agent_loop import AgentLoopBase, AgentLoopOutput
from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.agents.env import call_env, get_env_cls

__all__ = ["EnvAgentLoop"]


class EnvAgentLoop(AgentLoopBase):
    """Runs one episode of ``env`` per row (see the module docstring).

    Args:
        env: a registered environment name or a dotted class path.
        env_kwargs: constructor arguments of every episode's environment.
        max_steps: most model turns per episode.
        gamma: discount of the per-step rewards in the row's score.
        observation_role: the chat role observations are rendered as.
    """

    def __init__(self, *args: Any, env: str, env_kwargs: Optional[dict] = None, max_steps: int = 8,
                 gamma: float = 1.0, observation_role: str = "user", **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not (isinstance(max_steps, int) and max_steps >= 1) or not 0.0 <= float(gamma) <= 1.0:
            raise ValueError(f"EnvAgentLoop: max_steps={max_steps!r} must be a positive integer and gamma={gamma!r} "
                             "within [0, 1]. Fix: set them in the agent-loop YAML entry.")
        self.env_cls = get_env_cls(env, "EnvAgentLoop env")
        self.env_kwargs = dict(env_kwargs or {})
        self.max_steps, self.gamma, self.role = max_steps, float(gamma), observation_role
        self.budget = int(self.config.actor_rollout_ref.rollout.response_length)
        self.encoder = ObservationEncoder(self.tokenizer, getattr(self.tokenizer, "eos_token", None) or "")

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra = kwargs.get("extra_info") if isinstance(kwargs.get("extra_info"), dict) else {}
        row_env = dict(extra.get("env_kwargs") or {})
        seed, options = row_env.pop("seed", extra.get("index")), row_env.pop("options", None)
        env = self.env_cls(**{**self.env_kwargs, **row_env})
        try:
            observation, _ = await call_env(env.reset, seed=None if seed is None else int(seed), options=options)
            messages = list(kwargs.get("raw_prompt") or []) + [{"role": self.role, "content": str(observation)}]
            prompt = await self.apply_chat_template(messages)
            return await self._episode(env, prompt, sampling_params)
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                await call_env(close)

    async def _episode(self, env: Any, prompt: list[int], sampling_params: dict[str, Any]) -> AgentLoopOutput:
        ids: list[int] = []
        mask: list[int] = []
        log_probs: list[float] = []
        total, discount, steps, env_steps, ended = 0.0, 1.0, 0, 0, False
        while steps < self.max_steps and len(ids) < self.budget:
            out = await self.server_manager.generate(
                "env", prompt_ids=prompt + ids, sampling_params={**sampling_params, "max_tokens": self.budget - len(ids)})
            ids += out.token_ids
            mask += [1] * len(out.token_ids)
            log_probs += out.log_probs if out.log_probs is not None else [0.0] * len(out.token_ids)
            steps += 1
            if out.stop_reason != "completed":
                break  # cut by the budget mid-turn: no action to apply
            action = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            observation, reward, terminated, truncated, _ = await call_env(env.step, action)
            env_steps += 1
            total += discount * float(reward)
            discount *= self.gamma
            if terminated or truncated or steps >= self.max_steps:
                ended = bool(terminated)
                break
            delta = self.encoder.encode([{"role": self.role, "content": str(observation)}])
            if len(ids) + len(delta) >= self.budget:
                break
            ids += delta
            mask += [0] * len(delta)
            log_probs += [0.0] * len(delta)
        return AgentLoopOutput(prompt_ids=prompt, response_ids=ids, response_mask=mask, response_logprobs=log_probs,
                               reward_score=total, num_turns=2 * steps + 1,
                               metrics={"env_steps": env_steps, "env_turns": steps, "env_return": total,
                                        "env_terminated": float(ended)})
