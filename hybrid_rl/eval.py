"""Evaluate any model on held-out prompts: mean@n, pass@k, best@n and maj@n per data source, as JSON.

    python -m hybrid_rl.eval --model checkpoints/hybrid_rl/arithmetic_grpo/global_step_4
    python -m hybrid_rl.eval --model /path/to/hf_folder --data test.parquet --n 8 --output eval.json
    python -m hybrid_rl.eval --model ... --engine hf actor_rollout_ref.rollout.val_kwargs.temperature=0.6

``--model`` is a Hugging Face folder (or the embedded model's name), a hybrid_rl checkpoint
(``global_step_N`` or its ``actor/``; merged into a temporary HF folder first, LoRA adapters
included), as ``actor_rollout_ref.model.path`` accepts. ``--data`` are parquet/JSONL files in the
trainer's row format (default: the config's validation files, e.g. the default task's 200 held-out
problems). The trainer's own validation runs (the same prompts, chat template, rollout engine,
``rollout.val_kwargs`` sampling, reward functions and metric names ``val-core/<source>/reward/...``)
on rollout-only Ray workers: no actor, optimizer or reference is built. ``--n > 1`` samples
(``val_kwargs.do_sample=true temperature=1.0`` unless set); greedy otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

__all__ = ["evaluate", "main", "resolve_eval_model"]

_METRIC = re.compile(r"^val-core/(?P<source>.+)/reward/(?P<name>[^/]+)$")
_HEADLINE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>[^/]+)/(?P<name>(?:mean|best|maj)@\d+)(?:/mean)?$")


def resolve_eval_model(model: str, workdir: str) -> str:
    """``model`` itself, or for a hybrid_rl checkpoint (step folder or its ``actor/``) an HF folder
    merged from it into ``workdir``."""
    path = Path(model).expanduser()
    actor = path / "actor" if (path / "actor").is_dir() else path
    if (actor / "checkpoint_meta.json").is_file():
        from hybrid_rl.model_merger import merge_checkpoint

        return merge_checkpoint(str(actor), os.path.join(workdir, "merged"))
    if path.is_dir() and (path / "trainer_state.json").is_file():
        raise ValueError(f"--model {model}: a checkpoint step folder without actor/checkpoint_meta.json (an "
                         "incomplete checkpoint?). Fix: pass a complete global_step_N folder or an HF folder.")
    return model


def _overrides(model_dir: str, data: Sequence[str], n: int, engine: Optional[str], run_dir: str,
               extra: Sequence[str]) -> list[str]:
    out = [f"actor_rollout_ref.model.path={model_dir}", f"actor_rollout_ref.rollout.val_kwargs.n={n}",
           f"trainer.default_local_dir={run_dir}", "trainer.save_freq=-1", "trainer.logger=[console]"]
    if data:
        files = "[" + ",".join(os.path.abspath(f) for f in data) + "]"
        out += [f"data.val_files={files}", f"data.train_files={files}"]  # the trainer needs a train set too
    if engine:
        out.append(f"actor_rollout_ref.rollout.name={engine}")
    for key, value in (("do_sample", "true"), ("temperature", "1.0")):  # n > 1: sample unless told otherwise
        if n > 1 and not any(o.startswith(f"actor_rollout_ref.rollout.val_kwargs.{key}=") for o in extra):
            out.append(f"actor_rollout_ref.rollout.val_kwargs.{key}={value}")
    return out + list(extra)


def table(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """``{data_source: {"mean@n": ..., "pass@k": ..., "best@n": ...}}`` from the validation metrics:
    the reward's, and veRL's headline ``best@n`` / ``maj@n`` (and ``acc/...`` when the scorer gives
    ``acc``) with n > 1."""
    out: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        match = _METRIC.match(key)
        if match:
            out.setdefault(match["source"], {})[match["name"]] = value
            continue
        match = _HEADLINE.match(key)
        if match:
            name = match["name"] if match["var"] == "reward" else f"{match['var']}/{match['name']}"
            out.setdefault(match["source"], {})[name] = value
    return out


def evaluate(model: str, data: Sequence[str] = (), n: int = 1, engine: Optional[str] = None,
             overrides: Sequence[str] = (), output: Optional[str] = None) -> dict[str, Any]:
    """Evaluate ``model`` (see the module docstring); returns (and writes to ``output``) the result."""
    from hybrid_rl.trainer.core.worker_groups import WorkerGroups
    from hybrid_rl.trainer.ppo.workers import build_rollout_group
    from hybrid_rl.trainer.config.loader import get_config
    from hybrid_rl.trainer.main_ppo import build_trainer

    if n < 1:
        raise ValueError(f"--n {n}: the number of samples per prompt must be >= 1.")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hybrid_rl_eval_") as workdir:
        model_dir = resolve_eval_model(model, workdir)
        run_dir = os.path.dirname(os.path.abspath(output)) if output else workdir
        trainer = build_trainer(get_config(_overrides(model_dir, data, n, engine, run_dir, overrides)),
                                for_training=False)
        if trainer.val_dataset is None:
            raise ValueError("nothing to evaluate: the config has no validation files. Fix: pass --data FILE "
                             "(parquet or JSONL rows with prompt, data_source and reward_model.ground_truth).")
        cfg, plan = trainer.config, trainer.plan
        group, pool = build_rollout_group(cfg, plan, [cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes,
                                          rows_per_call=trainer._rollout_rows_per_call(),
                                          log_dir=os.path.join(run_dir, "logs"))
        trainer.workers = WorkerGroups(actor_rollout=group, critic=None, resource_pool=pool)
        try:
            metrics = trainer.run_validation()
        finally:
            trainer.shutdown()
    import torch

    result = {"model": model, "data": [str(f) for f in data] or "config validation files", "n": n,
              "engine": cfg.actor_rollout_ref.rollout.name, "rows": len(trainer.val_dataset),
              "cpu_capability": torch.backends.cpu.get_cpu_capability() if plan.device == "cpu" else plan.device,
              "seconds": round(time.perf_counter() - start, 1), "table": table(metrics), "metrics": metrics}
    if output:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return result


def _print(result: dict[str, Any]) -> None:
    names = sorted({k for row in result["table"].values() for k in row}, key=lambda k: (k.split("@")[0], int(k.split("@")[1])))
    print(f"{result['model']}: {result['rows']} prompts x n={result['n']}, {result['seconds']} s")
    widths = [max(10, len(name) + 2) for name in names]
    print(f"{'data_source':<24}" + "".join(f"{name:>{w}}" for name, w in zip(names, widths)))
    for source, row in sorted(result["table"].items()):
        print(f"{source:<24}" + "".join(f"{row[name]:>{w}.4f}" if name in row else f"{'-':>{w}}"
                                        for name, w in zip(names, widths)))


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    from hybrid_rl.debug import CONFIG_KEYS_EPILOG

    parser = argparse.ArgumentParser(prog="python -m hybrid_rl.eval", description=__doc__.splitlines()[0],
                                     epilog=CONFIG_KEYS_EPILOG)
    parser.add_argument("--model", required=True, help="HF folder, embedded model name, or hybrid_rl checkpoint")
    parser.add_argument("--data", nargs="*", default=[], help="parquet/JSONL files (default: the config's val files)")
    parser.add_argument("--n", type=int, default=1, help="samples per prompt (mean@n, pass@k)")
    parser.add_argument("--engine", choices=("vllm", "hf"), default=None, help="rollout engine (default: config)")
    parser.add_argument("--output", default=None, help="write the JSON result here")
    parser.add_argument("overrides", nargs="*", help="trainer config key=value overrides")
    args = parser.parse_args(argv)
    for file in args.data:
        if not os.path.isfile(file):
            parser.error(f"--data {file}: no such file")
    from hybrid_rl.utils.log_setup import configure_logging, only_own_handlers

    if only_own_handlers():  # a quiet console: warnings only (no start-up lines, no Ray or vLLM notes)
        configure_logging(own_level=logging.WARNING)
    result = evaluate(args.model, args.data, args.n, args.engine, args.overrides, args.output)
    _print(result)
    if args.output:
        print(f"written to {args.output}")
    return result


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:  # bad input: one clear line, no traceback
        from hybrid_rl.utils.redact import redact_text

        print(f"error: {redact_text(str(error))}", file=sys.stderr)
        sys.exit(2)
