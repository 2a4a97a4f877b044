"""Convert GSM8K to hybrid_rl/veRL parquet (``train.parquet``, ``test.parquet``).

Same semantics as veRL's ``examples/data_preprocess/gsm8k.py``: the question is followed by the
instruction below, ``data_source="openai/gsm8k"``, the ground truth is the number after ``####``
in the reference answer (commas removed), and ``extra_info`` keeps split/index/answer/question.

    python scripts/data/gsm8k.py                                    # openai/gsm8k via datasets (cached)
    python scripts/data/gsm8k.py --input_dir path/to/gsm8k          # offline: a local JSONL copy

Where the rows come from, as veRL's script: without ``--input_dir``, ``datasets.load_dataset("openai/gsm8k",
"main")`` (``--hf_dataset`` names another hub copy), downloaded once into the datasets cache
(``HF_DATASETS_CACHE``) and read from there afterwards, also with ``HF_DATASETS_OFFLINE=1`` /
``HF_HUB_OFFLINE=1``. ``--input_dir`` is the offline path: a folder with ``train.jsonl`` and
``test.jsonl`` (``question``/``answer`` per line, as in openai/grade-school-math). The parquet files go
to ``--local_save_dir`` (veRL's name; ``--output_dir`` and ``--local_dir`` also work), ``~/data/gsm8k``
by default.

The conversion lives in :mod:`hybrid_rl.data.gsm8k` (shared with ``python -m hybrid_rl.data.rlhf_data
--task gsm8k``); this file is its command line.

``--tool_agent`` writes rows for the multi-turn rollout with the built-in ``calculator`` tool (as
veRL's ``gsm8k_tool_agent_loop.py`` preprocessing, with our calculator instead of its answer-checking
tool): a system prompt naming the tool, ``agent_name: tool_agent`` and
``extra_info.tools_kwargs.calculator.create_kwargs.ground_truth``.

``--verl_tool`` writes veRL's ``gsm8k_multiturn_w_tool.py`` layout for veRL's answer-checking tool
``calc_gsm8k_reward`` (``recipes/gsm8k_verl_tool``): a system prompt asking the model to check its
answer with the tool, ``agent_name: tool_agent`` and
``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from hybrid_rl.data.gsm8k import (DATA_SOURCE, INSTRUCTION, OFFLINE_ENV, SPLITS, TOOL_SYSTEM_PROMPT,  # noqa: F401
                                  VERL_TOOL_SYSTEM_PROMPT, convert, extract_solution, hub_offline, hub_split,
                                  load_hub, make_row, read_splits, rows_from_hub, rows_from_jsonl, tool_agent_row,
                                  verl_tool_row, write_parquet)


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description="Convert GSM8K to hybrid_rl/veRL parquet.")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--input_dir", help="offline: folder with train.jsonl and test.jsonl (default: the hub)")
    src.add_argument("--hf_dataset", default=None,
                     help=f"hub dataset read with datasets.load_dataset(NAME, 'main') (default {DATA_SOURCE})")
    parser.add_argument("--local_save_dir", "--output_dir", "--local_dir", dest="output_dir", default="~/data/gsm8k",
                        help="where train.parquet/test.parquet go (veRL's --local_save_dir; default ~/data/gsm8k)")
    parser.add_argument("--tool_agent", action="store_true",
                        help="rows for the multi-turn rollout with the calculator tool (recipes/gsm8k_tool)")
    parser.add_argument("--verl_tool", action="store_true",
                        help="rows for veRL's calc_gsm8k_reward tool (recipes/gsm8k_verl_tool)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return convert(args.output_dir, input_dir=args.input_dir, hf_dataset=args.hf_dataset,
                       tool_agent=args.tool_agent, verl_tool=args.verl_tool)
    except ValueError as err:  # bad input or no data source: one line, no traceback
        parser.exit(2, f"gsm8k.py: error: {err}\n")


if __name__ == "__main__":
    main()
