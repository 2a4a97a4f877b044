"""Debug mode: look at what a config's rollout and reward do, without training (Trinity-RFT's idea).

    python -m hybrid_rl.debug rollout [--prompts 4] [--output exp.jsonl|exp.db] [key=value ...]
    python -m hybrid_rl.debug reward --input samples.jsonl [--output scored.jsonl] [key=value ...]
    python -m hybrid_rl.debug replay RUN_DIR --step K [--device cpu|cuda] [--json out.json] [key=value ...]

``rollout`` builds the trainer of the config (the same components: dataset, tokenizer, workers,
rollout engine with its tools, reward manager), generates for the first ``--prompts`` training
prompts (x ``rollout.n``), scores them, prints one line per sample (prompt, response, reward,
turns) and writes the experiences (:mod:`hybrid_rl.buffer`) to a JSONL file or, for ``.db`` or a
SQLAlchemy URL, to a SQL buffer; ``--output`` is checked first (a writable folder; a database that
connects, with a table this user can write), so a wrong one fails in one line before anything is
generated. ``reward`` scores the rows of a JSONL file (``data_source``,
``response`` or ``solution_str``, ``ground_truth``, optional ``extra_info``) with the config's reward
function (custom or built-in), under the same guard as training, and prints / writes them.
``replay`` re-runs the steps after generation and reward of step K of a finished run, from the
checkpoint before K and the batch the run dumped (``trainer.dump_replay_batch``), with the run's
key=value overrides (none: the config the run recorded beside its dumps), and sets each metric and
the final weights beside the run's (:mod:`hybrid_rl.trainer.ppo.replay`); exit status 1 when a replay
on the recording device differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional, Sequence

__all__ = ["debug_replay", "debug_reward", "debug_rollout", "main"]

_SHOWN_CHARS = 80
CONFIG_KEYS_EPILOG = ("key=value: any key of the trainer's config (python -m hybrid_rl.trainer.main_ppo --help lists "
                      "them with their documentation). Nothing is trained, so the update's batch sizes are not checked.")


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _SHOWN_CHARS else "..." + text[-(_SHOWN_CHARS - 3):]


def _write(rows: list[dict], output: str) -> None:
    if output.endswith(".jsonl"):
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        return
    raise ValueError(f"--output {output!r}: write a .jsonl file (or, for rollout, a .db / SQLAlchemy URL).")


def debug_rollout(overrides: Sequence[str], num_prompts: int = 4, output: Optional[str] = None) -> list[dict]:
    """Generate and score ``num_prompts`` prompts of the config; returns one dict per sample."""
    from hybrid_rl.buffer import experiences_from_batch
    from hybrid_rl.buffer.check import check_output_path
    from hybrid_rl.protocol import DataProto
    from hybrid_rl.trainer.main_ppo import build_trainer
    from hybrid_rl.trainer.config.loader import get_config

    if output:
        check_output_path(output)  # before the minutes of loading and generating
    trainer = build_trainer(get_config(list(overrides)), for_training=False)  # nothing is trained here
    try:
        dataset = trainer.train_dataset
        items = [dataset[i] for i in range(min(num_prompts, len(dataset)))]
        batch = DataProto.from_single_dict(dataset.collate_fn(items))
        trainer.init_workers()
        metrics: dict[str, Any] = {}
        batch = trainer.compute_reward(trainer.generate(batch, metrics), metrics)
    finally:
        trainer.shutdown()
    experiences = experiences_from_batch(batch, trainer.tokenizer, policy_version=0)
    rows = [e.to_dict() for e in experiences]
    print(f"{'#':>3} {'reward':>7} {'turns':>5}  prompt -> response")
    for i, e in enumerate(experiences):
        print(f"{i:>3} {e.reward:>7.3f} {e.extra.get('num_turns', 2):>5}  {_short(e.prompt_text)!r} -> "
              f"{_short(e.response_text)!r}")
    agent = {k: round(v, 4) for k, v in metrics.items() if k.startswith(("agent/", "reward/"))}
    if agent:
        print(json.dumps(agent))
    if output:
        if output.endswith(".jsonl"):
            _write(rows, output)
        else:
            from hybrid_rl.buffer import SQLBuffer

            buffer = SQLBuffer(output)
            buffer.put(experiences)
            buffer.close()
        from hybrid_rl.utils.redact import redact_url

        print(f"{len(rows)} experiences written to {redact_url(output)}")  # a database URL: no password
    return rows


def debug_reward(overrides: Sequence[str], input_path: str, output: Optional[str] = None) -> list[dict]:
    """Score the rows of ``input_path`` (JSONL) with the config's reward function."""
    from hybrid_rl.buffer.check import check_output_path
    from hybrid_rl.reward import default_compute_score, load_custom_reward_fn, safe_score_many
    from hybrid_rl.trainer.config.loader import get_config, to_ppo_config

    if output:
        check_output_path(output, sql=False)
    cfg = to_ppo_config(get_config(list(overrides)))
    fn = (load_custom_reward_fn(cfg.custom_reward_function.path, cfg.custom_reward_function.name)
          if cfg.custom_reward_function.path else default_compute_score)
    numbers, rows = _read_samples(input_path)
    calls = [((), dict(data_source=r["data_source"], solution_str=r["solution_str"], ground_truth=r["ground_truth"],
                       extra_info=r.get("extra_info"))) for r in rows]
    outcomes = safe_score_many(fn, calls, timeout_s=cfg.reward_model.timeout)
    scored = [{**r, "score": o.score, "status": o.status, **({"extra": o.extra} if o.extra else {})}
              for r, o in zip(rows, outcomes)]
    print(f"{'row':>3} {'score':>7} {'status':>8}  data_source: response")  # the input's row numbers
    for i, r in zip(numbers, scored):
        print(f"{i:>3} {r['score']:>7.3f} {r['status']:>8}  {r['data_source']}: {_short(r['solution_str'])!r}")
    if output:
        _write(scored, output)
        print(f"{len(scored)} scored rows written to {output}")
    return scored


def debug_replay(overrides: Sequence[str], run_dir: str, step: int, device: Optional[str] = None,
                 json_path: Optional[str] = None) -> dict:
    """Replay ``step`` of the run in ``run_dir``; prints the comparison, returns the report."""
    from hybrid_rl.trainer.ppo.replay import format_report, replay_step

    report = replay_step(run_dir, step, overrides, device)
    print(format_report(report))
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        print(f"report written to {json_path}")
    return report


def _read_samples(path: str) -> tuple[list[int], list[dict]]:
    """The row numbers and rows of a JSONL (or parquet) file, each row with ``solution_str`` set from
    ``response``; numbered as every data message (from 1; in JSON Lines the line, blank lines counted)."""
    from hybrid_rl.data.bad_rows import RowError
    from hybrid_rl.data.files import iter_records

    numbers, rows = [], []
    for number, row in iter_records(path):
        if isinstance(row, RowError):
            raise row
        text = row.get("solution_str", row.get("response"))
        missing = [k for k in ("data_source", "ground_truth") if k not in row] + ([] if text is not None else ["response"])
        if missing:
            raise ValueError(f"--input {path!r} row {number}: needs data_source, response (or solution_str) and "
                             f"ground_truth; missing {missing}.")
        numbers.append(number)
        rows.append({**row, "solution_str": text})
    return numbers, rows


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hybrid_rl.debug", description=__doc__.splitlines()[0],
                                     epilog=CONFIG_KEYS_EPILOG)
    sub = parser.add_subparsers(dest="command", required=True)
    rollout = sub.add_parser("rollout", help="generate + score a few prompts of the config, no training")
    rollout.add_argument("--prompts", type=int, default=4, help="training prompts to use (each x rollout.n)")
    rollout.add_argument("--output", help="experiences to a .jsonl file, or a .db file / SQLAlchemy URL (SQL buffer)")
    reward = sub.add_parser("reward", help="score a JSONL file with the config's reward")
    reward.add_argument("--input", required=True, help="JSONL: data_source, response, ground_truth per line")
    reward.add_argument("--output", help="scored rows to this .jsonl file")
    replay = sub.add_parser("replay", help="re-run step K's updates from its checkpoint and dumped batch")
    replay.add_argument("run_dir", help="the run's folder (trainer.default_local_dir): checkpoints, metrics.jsonl")
    replay.add_argument("--step", type=int, required=True, help="the step to replay (needs global_step_{K-1})")
    replay.add_argument("--device", choices=("cpu", "cuda"), help="where to replay (default: the config's)")
    replay.add_argument("--json", dest="json_path", help="also write the report to this JSON file")
    args, overrides = parser.parse_known_args(argv)
    unknown = [a for a in overrides if "=" not in a]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides are key=value)")
    from hybrid_rl.trainer.config.loader import check_override_keys
    from hybrid_rl.trainer.modes import fail as _fail

    try:
        check_override_keys(overrides)
        if args.command == "rollout":
            debug_rollout(overrides, args.prompts, args.output)
        elif args.command == "replay":
            from hybrid_rl.trainer.ppo.replay import replay_differs, same_device

            report = debug_replay(overrides, args.run_dir, args.step, args.device, args.json_path)
            if same_device(report) and replay_differs(report):
                sys.exit(1)
        else:
            debug_reward(overrides, args.input, args.output)
    except ValueError as error:
        _fail(error)


if __name__ == "__main__":
    main(sys.argv[1:])
