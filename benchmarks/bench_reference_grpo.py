"""Reference single-process GRPO loop on the embedded SmolLM2-135M-Instruct (synthetic arithmetic).

The yardstick the distributed trainer must match in learning (held-out greedy accuracy per step)
and compare against in speed. No Ray, no DataProto, no FSDP: sample ``n`` responses per prompt
(vLLM in-process or HF ``generate``), score exact-match of the number after ``####``, GRPO
advantages, ONE on-policy policy-gradient step per batch (so ``old_log_prob = log_prob.detach()``
and the PPO ratio is 1), AdamW, bf16 autocast over fp32 master weights, no KL.

Run from the repo root (vLLM's CPU backend needs the ``__main__`` guard this file has)::

    PYTHONPATH=. python benchmarks/bench_reference_grpo.py --out /tmp/grpo_ref.jsonl   # PYTHONPATH until pip-installed

Every line of ``--out`` is a JSON record: ``{"kind": "eval", "step", "acc", ...}`` or
``{"kind": "step", "step", "reward", "t_gen", "t_update", ...}``; a summary is logged at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time
from dataclasses import dataclass

import torch

from hybrid_rl.algorithms import (compute_grpo_outcome_advantage, compute_policy_loss_vanilla,
                                  global_batch_denominators, logprobs_from_logits)
from hybrid_rl.data.arithmetic import PROMPT_TEMPLATE, normalize_ops, operand_range, sample_problems, solve
from hybrid_rl.reward.scorers.arithmetic import compute_score
from hybrid_rl.workers.model_loader import ensure_embedded_model, load_causal_lm, load_tokenizer

logger = logging.getLogger("bench_reference_grpo")


@dataclass
class Problem:
    """One arithmetic problem: rendered chat prompt, its token ids, and the integer answer."""

    text: str
    ids: list[int]
    answer: int


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="+", default=["+"], help="any of + - *")
    p.add_argument("--min_digits", type=int, default=1)
    p.add_argument("--max_digits", type=int, default=2)
    p.add_argument("--prompt_template", default="What is {a} {op} {b}?",
                   help=f"user message with {{a}} {{op}} {{b}} fields; hybrid_rl.data's is {PROMPT_TEMPLATE!r}")
    p.add_argument("--shots", type=int, default=1,
                   help="solved demo turns (user question / assistant 'a op b = c\\n#### c') before the question")
    p.add_argument("--default_system_prompt", action="store_true",
                   help="let SmolLM2's template inject its default system prompt (16 more prompt tokens); "
                        "by default an empty system message is passed")
    p.add_argument("--prompts_per_step", type=int, default=16)
    p.add_argument("--n", type=int, default=8, help="responses sampled per prompt")
    p.add_argument("--max_new_tokens", type=int, default=24,
                   help="'99 + 99 = 198\\n#### 198<|im_end|>' is 18 tokens (digits are single tokens); 16 truncates")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--grad_clip", type=float, default=1.0)
    p.add_argument("--loss_agg_mode", default="token-mean")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eval_size", type=int, default=200)
    p.add_argument("--eval_every", type=int, default=4)
    p.add_argument("--micro_batch", type=int, default=32, help="sequences per forward/backward")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast dtype of the update")
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="JSONL file of eval/step records")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- data


def make_problems(args, tokenizer) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train / held-out problems (drawn without replacement), rendered with the chat template."""
    ops = normalize_ops(args.ops)
    lo, hi = operand_range(args.min_digits, args.max_digits)
    space = len(ops) * (hi - lo + 1) ** 2
    num_train = min(space - args.eval_size, max(args.steps * args.prompts_per_step, 1000))
    triples = sample_problems(args.eval_size + num_train, args.seed, ops, lo, hi)
    problems = []
    for a, op, b in triples:
        messages = demo_messages(args, ops) + [
            {"role": "user", "content": args.prompt_template.format(a=a, op=op, b=b)}]
        if not args.default_system_prompt:
            messages.insert(0, {"role": "system", "content": ""})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        problems.append(Problem(text, ids, solve(a, op, b)))
    return problems[args.eval_size:], problems[: args.eval_size]


_DEMOS = ((7, 5), (31, 9), (6, 4))


def demo_messages(args, ops: tuple[str, ...]) -> list[dict]:
    """``args.shots`` solved example turns; they teach the '#### n' format the 135M model rarely
    produces zero-shot (0% greedy accuracy without them), and writing the equation first helps it."""
    messages = []
    for i in range(args.shots):
        (a, b), op = _DEMOS[i % len(_DEMOS)], ops[i % len(ops)]
        answer = solve(a, op, b)
        messages += [{"role": "user", "content": args.prompt_template.format(a=a, op=op, b=b)},
                     {"role": "assistant", "content": f"{a} {op} {b} = {answer}\n#### {answer}"}]
    return messages


# ----------------------------------------------------------------------------- engines


class VLLMEngine:
    """In-process vLLM (eager) with full-state-dict weight reloads after every update."""

    def __init__(self, model_dir: str, args) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        self.llm = LLM(model=model_dir, dtype="bfloat16", enforce_eager=True, seed=args.seed,
                       max_model_len=256, enable_prefix_caching=True)

    def generate(self, problems: list[Problem], n: int, temperature: float, max_tokens: int,
                 seed: int | None) -> list[list[list[int]]]:
        """Token ids (EOS included when generated) of ``n`` responses per problem."""
        from vllm import SamplingParams

        # No per-request seed: on the CPU backend it fails ("CPU Generator does not use offset");
        # sampling is seeded once by the engine seed instead.
        params = SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens)
        prompts = [{"prompt_token_ids": p.ids} for p in problems]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[list(c.token_ids) for c in o.outputs] for o in outs]

    def sync(self, model: torch.nn.Module) -> None:
        weights = ((k, v.detach().to(torch.bfloat16)) for k, v in model.state_dict().items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights


class HFEngine:
    """HF ``generate`` on the training model itself under bf16 autocast (no weight copy needed)."""

    def __init__(self, model: torch.nn.Module, tokenizer, dtype: torch.dtype) -> None:
        self.model, self.tok, self.dtype = model, tokenizer, dtype

    @torch.no_grad()
    def generate(self, problems, n, temperature, max_tokens, seed):
        ids, mask = left_pad([p.ids for p in problems for _ in range(n)], self.tok.pad_token_id)
        if seed is not None:
            torch.manual_seed(seed)
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 \
            else dict(do_sample=False)
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32):
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                                      eos_token_id=self.tok.eos_token_id, pad_token_id=self.tok.pad_token_id,
                                      **sampling)
        resp = [cut_at_eos(row.tolist(), self.tok.eos_token_id) for row in out[:, ids.shape[1]:]]
        return [resp[i * n:(i + 1) * n] for i in range(len(problems))]

    def sync(self, model) -> None:
        pass  # generates with the training model itself


def cut_at_eos(tokens: list[int], eos: int) -> list[int]:
    """Tokens up to and including the first EOS (pad == eos for SmolLM2, so padding is dropped too)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def left_pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    return ids, mask


# ----------------------------------------------------------------------------- reward / eval


def score(tokenizer, tokens: list[int], answer: int) -> float:
    return compute_score(tokenizer.decode(tokens, skip_special_tokens=True), answer)


def evaluate(engine, tokenizer, problems: list[Problem], max_tokens: int) -> dict:
    """Greedy accuracy and mean response length on the held-out set."""
    start = time.perf_counter()
    outs = engine.generate(problems, 1, 0.0, max_tokens, None)
    scores = [score(tokenizer, o[0], p.answer) for o, p in zip(outs, problems)]
    return {"acc": sum(scores) / len(scores), "resp_len": sum(len(o[0]) for o in outs) / len(outs),
            "t_eval": time.perf_counter() - start,
            "sample": tokenizer.decode(outs[0][0], skip_special_tokens=True)}


# ----------------------------------------------------------------------------- update


def build_batch(problems, responses, pad: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts ‖ right-padded responses: ids/mask/positions [B, P+R], response_mask [B, R]."""
    prompt_ids, prompt_mask = left_pad([p.ids for p in problems], pad)
    width = max(1, max(len(r) for r in responses))
    resp = torch.full((len(responses), width), pad, dtype=torch.long)
    resp_mask = torch.zeros((len(responses), width), dtype=torch.float32)
    for i, r in enumerate(responses):
        resp[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        resp_mask[i, : len(r)] = 1.0
    mask = torch.cat([prompt_mask, resp_mask.long()], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return {"input_ids": torch.cat([prompt_ids, resp], dim=1), "attention_mask": mask,
            "position_ids": positions, "responses": resp, "response_mask": resp_mask}


def policy_update(model, optimizer, batch, advantages, args, dtype) -> dict:
    """One PG step over the whole batch in micro-batches; token-mean over the WHOLE batch."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    denominators = global_batch_denominators(batch["response_mask"])
    width = batch["responses"].shape[1]
    loss_sum = 0.0
    for s in range(0, batch["input_ids"].shape[0], args.micro_batch):
        mb = {k: v[s:s + args.micro_batch] for k, v in batch.items()}
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                           position_ids=mb["position_ids"], logits_to_keep=width + 1).logits
        log_prob = logprobs_from_logits(logits[:, :-1].float(), mb["responses"])  # [b, R]
        loss, _, _, _ = compute_policy_loss_vanilla(
            log_prob.detach(), log_prob, advantages[s:s + args.micro_batch], mb["response_mask"],
            loss_agg_mode=args.loss_agg_mode, **denominators)  # whole-batch denominators: sum of
        # the micro-batch losses equals the whole-batch loss, so gradients just accumulate
        loss.backward()
        loss_sum += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    optimizer.step()
    model.eval()
    return {"pg_loss": loss_sum, "grad_norm": float(grad_norm)}


def train_step(step, engine, model, optimizer, tokenizer, train, rng, args, dtype) -> dict:
    t0 = time.perf_counter()
    problems = rng.sample(train, args.prompts_per_step)
    outs = engine.generate(problems, args.n, args.temperature, args.max_new_tokens, args.seed * 100003 + step)
    t1 = time.perf_counter()
    rows = [(p, r, i) for i, (p, group) in enumerate(zip(problems, outs)) for r in group]
    scores = torch.tensor([score(tokenizer, r, p.answer) for p, r, _ in rows])
    batch = build_batch([p for p, _, _ in rows], [r for _, r, _ in rows], tokenizer.pad_token_id)
    rewards = torch.zeros_like(batch["response_mask"])
    last = (batch["response_mask"].sum(dim=1).long() - 1).clamp(min=0)
    rewards[torch.arange(len(rows)), last] = scores
    adv, _ = compute_grpo_outcome_advantage(rewards, batch["response_mask"], [i for _, _, i in rows])
    t2 = time.perf_counter()
    stats = policy_update(model, optimizer, batch, adv, args, dtype)
    t3 = time.perf_counter()
    engine.sync(model)
    t4 = time.perf_counter()
    eos = tokenizer.eos_token_id
    return {"kind": "step", "step": step, "reward": scores.mean().item(),
            "solved_groups": sum(1 for g in scores.view(-1, args.n) if g.std() > 0) / args.prompts_per_step,
            "resp_len": batch["response_mask"].sum(1).mean().item(),
            "no_eos": sum(1 for _, r, _ in rows if eos not in r) / len(rows),
            **stats, "t_gen": t1 - t0, "t_reward_adv": t2 - t1, "t_update": t3 - t2, "t_sync": t4 - t3,
            "t_step": t4 - t0}


# ----------------------------------------------------------------------------- main


def record(out, rec: dict) -> None:
    logger.info(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))
    if out is not None:
        out.write(json.dumps(rec) + "\n")
        out.flush()


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    # vLLM's CPU backend drops to 1 thread "for serving" unless OMP_NUM_THREADS is set.
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t_start = time.perf_counter()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    model_dir = str(ensure_embedded_model())
    tokenizer = load_tokenizer(model_dir)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = load_causal_lm(model_dir, dtype="float32")
    engine = VLLMEngine(model_dir, args) if args.engine == "vllm" else HFEngine(model, tokenizer, dtype)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # in-process vLLM re-seeds the global RNG
    train, test = make_problems(args, tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    rng = random.Random(args.seed)
    out = open(args.out, "w") if args.out else None
    record(out, {"kind": "config", **vars(args), "t_startup": time.perf_counter() - t_start})
    history = []
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            rec = {"kind": "eval", "step": step, **evaluate(engine, tokenizer, test, args.max_new_tokens),
                   "t_wall": time.perf_counter() - t_start}
            record(out, rec)
            history.append(rec)
        if step < args.steps:
            record(out, train_step(step, engine, model, optimizer, tokenizer, train, rng, args, dtype))
    curve = " ".join(f"{h['step']}:{h['acc']:.3f}" for h in history)
    logger.info("SUMMARY acc curve %s | wall %.1f s", curve, time.perf_counter() - t_start)
    if out is not None:
        out.close()
    return history


if __name__ == "__main__":
    main()
