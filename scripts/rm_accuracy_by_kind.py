"""Held-out pairwise accuracy of an exported reward model, per rejected kind.

    python scripts/rm_accuracy_by_kind.py --model rm_hf --pairs ~/.cache/hybrid_rl/arithmetic/rlhf-*/pairs_test.parquet

Scores each pair's chosen and rejected response with a plain ``AutoModelForSequenceClassification``
forward (the conversation rendered by the reward model's own chat template, as the RL worker does)
and prints the share of pairs where chosen scores higher, for each value of ``--by`` (the
``rejected_kind`` column of ``hybrid_rl.data.rlhf_data``'s pairs) and overall.
"""

from __future__ import annotations

import argparse
import collections

import pandas as pd
import torch


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="reward-model HF folder (model_merger export)")
    parser.add_argument("--pairs", required=True, help="parquet with prompt (messages), chosen, rejected")
    parser.add_argument("--by", default="rejected_kind", help="column to group the accuracy by")
    args = parser.parse_args(argv)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(args.model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def score(prompt: list[dict], response: str) -> float:
        text = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": response}], tokenize=False)
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
        with torch.no_grad():
            return float(model(input_ids=ids).logits[0, 0])

    right: dict[str, list[bool]] = collections.defaultdict(list)
    for _, row in pd.read_parquet(args.pairs).iterrows():
        prompt = [dict(m) for m in row["prompt"]]
        won = score(prompt, row["chosen"]) > score(prompt, row["rejected"])
        right[str(row.get(args.by, "all"))].append(won)
        right["overall"].append(won)
    accuracy = {k: sum(v) / len(v) for k, v in right.items()}
    for key, value in accuracy.items():
        print(f"{key}: {sum(right[key])}/{len(right[key])} = {value:.1%}")
    return accuracy


if __name__ == "__main__":
    main()
