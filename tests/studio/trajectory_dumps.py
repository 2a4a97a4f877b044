"""A hand-made dump step for the trajectory viewer's tests, written by the trainer's own dump writer.

Two prompt groups: ``calc`` (a multi-turn row that calls the calculator and reads its answer as a tool
observation, and a row corrected by an environment's user turn) and ``plain`` (three one-turn rows).
GRPO's advantages come from the registered estimator; per token, the training log-prob is -0.5, the
rollout's is -0.5 + 0.1 * (t % 3) (t: the token's position), the entropy 0.25 * (t % 4), all 0 on
observations, as the rollout and trainer leave them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hybrid_rl.algorithms.advantage import compute_grpo_outcome_advantage
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core.dumps import DumpPart, StepDumps

PROMPT = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"
CALL = 'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call><|im_end|>'
TOOL = "\n<|im_start|>tool\n<tool_response>42</tool_response><|im_end|>\n<|im_start|>assistant\n"
RETRY = "\n<|im_start|>user\nCheck it again.<|im_end|>\n<|im_start|>assistant\n"
ROWS = [  # (uid, [(text, mask)], score)
    ("calc", [(CALL, 1), (TOOL, 0), ("#### 42<|im_end|>", 1)], 1.0),
    ("calc", [("I think 40.<|im_end|>", 1), (RETRY, 0), ("#### 40<|im_end|>", 1)], 0.0),
    ("plain", [("#### 42<|im_end|>", 1)], 1.0),
    ("plain", [("#### 41 caf\u00e9<|im_end|>", 1)], 0.0),
    ("plain", [("The answer is 12<|im_end|>", 1)], 0.0),
]
"""The step's rows; the last-but-one holds a character of two bytes (two tokens of the byte tokenizer)."""


def rollout_log_prob(t: int) -> float:
    return -0.5 + 0.1 * (t % 3)


def entropy(t: int) -> float:
    return 0.25 * (t % 4)


def step_batch(tokenizer) -> tuple[DataProto, list[float]]:
    """The rows of :data:`ROWS` as a training batch after the update: padded tensors [B, *], GRPO's advantages."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    prompt = encode(PROMPT)
    responses = [[(tok, mask) for text, mask in turns for tok in encode(text)] for _, turns, _ in ROWS]
    width = max(len(r) for r in responses)
    b = len(ROWS)
    ids, mask, attention = torch.zeros(b, width, dtype=torch.long), torch.zeros(b, width, dtype=torch.long), \
        torch.zeros(b, width, dtype=torch.long)
    for i, row in enumerate(responses):
        ids[i, :len(row)] = torch.tensor([t for t, _ in row])
        mask[i, :len(row)] = torch.tensor([m for _, m in row])
        attention[i, :len(row)] = 1
    positions = torch.arange(width, dtype=torch.float32).expand(b, width)
    rollout = torch.where(mask.bool(), -0.5 + 0.1 * (positions % 3), torch.zeros(()))
    old = torch.where(mask.bool(), torch.full((b, width), -0.5), torch.zeros(()))
    entropys = torch.where(mask.bool(), 0.25 * (positions % 4), torch.zeros(()))
    scores = [score for _, _, score in ROWS]
    rewards = torch.zeros(b, width)
    rewards[torch.arange(b), attention.sum(-1) - 1] = torch.tensor(scores)
    uids = np.array([uid for uid, _, _ in ROWS], dtype=object)
    advantages, returns = compute_grpo_outcome_advantage(rewards, mask, uids)
    prompts = torch.tensor([prompt] * b)
    batch = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": ids, "response_mask": mask,
                 "attention_mask": torch.cat([torch.ones_like(prompts), attention], 1),
                 "rollout_log_probs": rollout, "old_log_probs": old, "entropys": entropys,
                 "advantages": advantages, "returns": returns, "token_level_scores": rewards},
        non_tensors={"uid": uids, "data_source": np.array(["calc"] * b, dtype=object),
                     "num_turns": np.array([len(turns) + 1 for _, turns, _ in ROWS], dtype=object),
                     "reward_model": np.array([{"ground_truth": "42"}] * b, dtype=object)})
    return batch, scores


def write_step(folder: Path, tokenizer, step: int = 1, compress: bool = False) -> tuple[str, str]:
    """Dump :data:`ROWS` as ``step`` into ``folder`` with the trainer's writer; the two paths."""
    batch, scores = step_batch(tokenizer)
    return StepDumps(str(folder), tokenizer, compress=compress).write(
        step, [DumpPart(batch, scores, {"acc": [s == 1.0 for s in scores]})])
