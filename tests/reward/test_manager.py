"""Reward managers: decoding, score placement, naive == batch, failure metrics and logging."""

import logging
import threading
import time

import numpy as np
import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.reward import (
    BatchRewardManager,
    NaiveRewardManager,
    get_reward_manager_cls,
    register_reward_manager,
)
from hybrid_rl.reward import manager as manager_module
from hybrid_rl.utils.testing import build_byte_tokenizer
from tests.reward.hang import BUDGET_S, HANG_S, RELEASE as _RELEASE

EOS, PAD = 2, 0


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def make_batch(tokenizer, responses, ground_truths, sources=None, prompt="Q?", resp_len=16, eos=True,
               extra_infos=None):
    """Left-padded prompts || right-padded responses (+EOS), in the schema's key names."""
    rows = len(responses)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    prompt_len = len(prompt_ids) + 2
    prompts = torch.full((rows, prompt_len), PAD)
    prompts[:, -len(prompt_ids):] = torch.tensor(prompt_ids)
    resp = torch.full((rows, resp_len), PAD)
    resp_mask = torch.zeros(rows, resp_len, dtype=torch.int64)
    for i, text in enumerate(responses):
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + ([EOS] if eos else []))[:resp_len]
        resp[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        resp_mask[i, : len(ids)] = 1
    prompt_mask = (prompts != PAD).long()
    non_tensors = {
        "data_source": np.array(sources or ["arithmetic"] * rows, dtype=object),
        "reward_model": np.array([{"ground_truth": gt, "style": "rule"} for gt in ground_truths], dtype=object),
    }
    if extra_infos is not None:
        non_tensors["extra_info"] = np.array(extra_infos, dtype=object)
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": resp, "response_mask": resp_mask,
                 "input_ids": torch.cat([prompts, resp], 1), "attention_mask": torch.cat([prompt_mask, resp_mask], 1)},
        non_tensors=non_tensors,
    )


def test_scores_at_last_valid_token(tokenizer):
    data = make_batch(tokenizer, ["#### 7", "#### 8", "", "#### 12345678901234567"], [7, 7, 7, 12345678901])
    scores = NaiveRewardManager(tokenizer, num_examine=0)(data)
    assert scores.dtype == torch.float32 and scores.shape == (4, 16)
    expected = torch.zeros(4, 16)
    expected[0, 6] = 1.0  # "#### 7" is 6 bytes + EOS at index 6
    expected[3, 15] = 1.0  # cut at 16 tokens (no EOS): the model's visible answer is "#### 12345678901"
    # row 1: wrong answer scores 0; row 2: EOS only, scored "" -> 0
    assert torch.equal(scores, expected)


def test_custom_manager_and_empty_mask_row(tokenizer, monkeypatch):
    monkeypatch.setattr(manager_module, "_MANAGERS", manager_module._MANAGERS.copy())

    @register_reward_manager("test_always_one")
    class AlwaysOne(NaiveRewardManager):
        pass

    data = make_batch(tokenizer, ["a", ""], [1, 1], eos=False)
    scores = get_reward_manager_cls("test_always_one")(tokenizer, 0, compute_score=lambda **kw: 1.0)(data)
    assert scores[0].tolist() == [1.0] + [0.0] * 15
    assert scores[1].abs().sum() == 0  # no valid token to carry the score


def test_response_mask_fallback_and_decoding(tokenizer):
    data = make_batch(tokenizer, ["#### 7 é∑"], [7])  # multi-byte unicode decodes intact
    data.pop(batch_keys=["attention_mask"])
    seen = []

    def spy(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 0.5

    scores = NaiveRewardManager(tokenizer, 0, compute_score=spy, isolation="thread")(data)
    assert seen == [("arithmetic", "#### 7 é∑", 7, None)]  # EOS (a special token) is skipped
    last = len("#### 7 é∑".encode())  # index of EOS
    assert scores[0, last] == 0.5 and scores.sum() == 0.5


def test_naive_and_batch_agree(tokenizer):
    texts = ["#### 3", r"\boxed{\frac12}", "#### 9", "#### 10", r"\boxed{2}", "#### 4"]
    truths = [3, "0.5", "9", 11, "3", "4"]
    sources = ["arithmetic", "math", "openai/gsm8k", "arithmetic", "lighteval/MATH", "openai/gsm8k"]
    data = make_batch(tokenizer, texts, truths, sources, resp_len=24)
    naive = NaiveRewardManager(tokenizer, 0)(data, return_dict=True)
    batch = BatchRewardManager(tokenizer, 0)(data, return_dict=True)
    assert torch.equal(naive["reward_tensor"], batch["reward_tensor"])
    assert naive["reward_tensor"].sum(1).tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert naive["reward_metrics"] == batch["reward_metrics"]
    assert get_reward_manager_cls("naive") is NaiveRewardManager
    assert get_reward_manager_cls("batch") is BatchRewardManager


def test_reward_kwargs_and_extra_info(tokenizer):
    data = make_batch(tokenizer, ["#### 1", "#### 2"], [1, 1], extra_infos=[{"index": 0}, {"index": 1}])

    def scorer(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        return {"score": float(solution_str.endswith(str(ground_truth))) + bonus, "idx": extra_info["index"]}

    out = NaiveRewardManager(tokenizer, 0, compute_score=scorer, bonus=0.5)(data, return_dict=True)
    assert out["reward_extra_info"] == {"score": [1.5, 0.5], "idx": [0, 1]}
    assert out["reward_tensor"].sum(1).tolist() == [1.5, 0.5]


def _mixed_scorer(data_source, solution_str, ground_truth, extra_info=None):
    kind = solution_str.split()[-1]
    if kind == "raise":
        raise ValueError("boom")
    if kind == "sleep":
        _RELEASE.wait(HANG_S)
    return {"nan": float("nan"), "none": None, "str": "1.0", "ok": 1.0}[kind]


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_failure_metrics_and_logging_once(tokenizer, caplog, isolation):
    texts = ["x ok", "x raise", "x nan", "x none", "x str", "x sleep", "x raise", "x ok"]
    data = make_batch(tokenizer, texts, [0] * len(texts))
    manager = NaiveRewardManager(tokenizer, 0, compute_score=_mixed_scorer, timeout_s=BUDGET_S, isolation=isolation)
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="hybrid_rl.reward.manager"):
        out = manager(data, return_dict=True)
    assert time.perf_counter() - start < BUDGET_S + HANG_S / 2  # not held for the hung row
    assert out["reward_tensor"].sum(1).tolist() == [1.0, 0, 0, 0, 0, 0, 0, 1.0]
    assert manager.last_metrics == out["reward_metrics"] == {
        "reward/num_errors": 2, "reward/num_timeouts": 1, "reward/num_invalid": 3, "reward/num_failed": 6,
        "reward/num_samples": 8, "reward/all_failed": 0.0}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3  # one per failure kind, not one per failed row
    assert "reward error" in warnings[0] and "boom" in warnings[0] and "x raise" in warnings[0]
    caplog.clear()
    manager(data)
    assert not caplog.records  # already logged once


def test_all_failed_and_truncated_logging(tokenizer, caplog):
    data = make_batch(tokenizer, ["y" * 40, "z"], [0, 0], resp_len=64)
    manager = NaiveRewardManager(tokenizer, 0, compute_score=lambda **kw: 1 / 0, isolation="thread")
    with caplog.at_level(logging.WARNING):
        manager(data)
    assert manager.last_metrics["reward/all_failed"] == 1.0 and manager.last_metrics["reward/num_errors"] == 2
    assert "ZeroDivisionError" in caplog.text


def test_batch_manager_guards_the_whole_call(tokenizer):
    data = make_batch(tokenizer, ["#### 1", "#### 2", "#### 3"], [1, 2, 3])

    def wrong_length(data_sources, solution_strs, ground_truths, extra_infos):
        return [1.0]

    def hangs(**kwargs):
        _RELEASE.wait(HANG_S)

    def mixed(data_sources, solution_strs, ground_truths, extra_infos):
        return np.array([1.0, np.nan, 0.5])

    out = BatchRewardManager(tokenizer, 0, compute_score=wrong_length)(data, return_dict=True)
    assert out["reward_metrics"]["reward/num_invalid"] == 3 and out["reward_tensor"].sum() == 0
    start = time.perf_counter()
    manager = BatchRewardManager(tokenizer, 0, compute_score=hangs, timeout_s=0.2)
    assert manager(data).sum() == 0 and manager.last_metrics["reward/num_timeouts"] == 3
    assert time.perf_counter() - start < HANG_S / 2  # not held for the hung call
    manager = BatchRewardManager(tokenizer, 0, compute_score=mixed)
    assert manager(data).sum(1).tolist() == [1.0, 0.0, 0.5]
    assert manager.last_metrics["reward/num_invalid"] == 1


def test_rm_scores_pass_through(tokenizer):
    data = make_batch(tokenizer, ["a"], [0])
    data.batch["rm_scores"] = torch.full((1, 16), 0.25)
    assert torch.equal(NaiveRewardManager(tokenizer, 0)(data), torch.full((1, 16), 0.25))


def test_configuration_errors_raise(tokenizer):
    data = make_batch(tokenizer, ["#### 1"], [1], sources=["no/such_source"])
    with pytest.raises(ValueError, match="no reward function for data_source 'no/such_source'"):
        NaiveRewardManager(tokenizer, 0)(data)
    data = make_batch(tokenizer, ["#### 1"], [1])
    with pytest.raises(ValueError, match="non_tensor_batch has no 'source'"):
        NaiveRewardManager(tokenizer, 0, reward_fn_key="source")(data)
    data.non_tensor_batch["reward_model"] = np.array([{"style": "rule"}], dtype=object)
    with pytest.raises(ValueError, match="row 0: .*'ground_truth'"):
        NaiveRewardManager(tokenizer, 0)(data)
    with pytest.raises(ValueError, match="unknown reward_model.reward_manager 'fancy'.*'batch', 'naive'"):
        get_reward_manager_cls("fancy")
    with pytest.raises(ValueError, match="already registered"):
        register_reward_manager("naive")(BatchRewardManager)


def test_num_examine_logs_per_data_source(tokenizer, caplog):
    data = make_batch(tokenizer, ["#### 1", "#### 2", "#### 3", "#### 4"], [1, 2, 3, 4],
                      sources=["arithmetic", "arithmetic", "openai/gsm8k", "openai/gsm8k"])
    with caplog.at_level(logging.INFO, logger="hybrid_rl.reward.manager"):
        NaiveRewardManager(tokenizer, num_examine=1)(data)
    examples = [r.getMessage() for r in caplog.records]
    assert len(examples) == 2
    assert examples[0].startswith("[arithmetic] prompt: Q?") and "[response] #### 1" in examples[0]
    assert examples[1].startswith("[openai/gsm8k]") and "[score] 1.0 (ok)" in examples[1]


def _multi_turn(tokenizer, tool_rewards, turn_scores):
    """Row 0: 'call<EOS>' | observation '= 7' (mask 0) | '#### 7<EOS>'; row 1 ends on an observation."""
    data = make_batch(tokenizer, ["call", "call"], [7, 7], resp_len=24, extra_infos=[{"k": 1}, None])
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = [enc("call") + [EOS] + enc("= 7") + enc("#### 7") + [EOS], enc("call") + [EOS] + enc("#### 7")]
    masks = [[1] * 5 + [0] * 3 + [1] * 7, [1] * 5 + [0] * 6]
    for i, (ids, mask) in enumerate(zip(rows, masks)):
        data.batch["responses"][i, : len(ids)] = torch.tensor(ids)
        data.batch["response_mask"][i] = torch.tensor(mask + [0] * (24 - len(mask)))
        data.batch["attention_mask"][i, -24:] = torch.tensor([1] * len(ids) + [0] * (24 - len(ids)))
    data.non_tensor_batch["tool_rewards"] = np.array([tool_rewards, []], dtype=object)
    data.non_tensor_batch["turn_scores"] = np.array([turn_scores, [0.5]], dtype=object)
    data.non_tensor_batch["num_turns"] = np.array([4, 3], dtype=object)
    return data


def test_multi_turn_score_on_last_model_token_and_trajectory_info(tokenizer):
    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((solution_str, extra_info))
        return 1.0 if solution_str.endswith("#### 7") else 0.0

    data = _multi_turn(tokenizer, [0.0, 1.0], [])
    scores = NaiveRewardManager(tokenizer, num_examine=0, compute_score=score, isolation="thread")(data)
    # row 0: the whole trajectory is scored, the score sits on its last model token (index 14)
    assert seen[0][0] == "call= 7#### 7" and scores[0].nonzero().flatten().tolist() == [14]
    # row 1 ends on observation tokens: the score goes to its last model token (index 4), not index 10
    assert scores[1].nonzero().flatten().tolist() == [4] and seen[1][0] == "call#### 7"
    assert seen[0][1] == {"k": 1, "tool_rewards": [0.0, 1.0], "turn_scores": [], "num_turns": 4}
    assert seen[1][1]["num_turns"] == 3


def test_tool_reward_weight_adds_tool_rewards_and_turn_scores(tokenizer):
    data = _multi_turn(tokenizer, [0.25, 1.0], [0.5])
    plain = NaiveRewardManager(tokenizer, num_examine=0, isolation="thread")(data)
    weighted = NaiveRewardManager(tokenizer, num_examine=0, isolation="thread", tool_reward_weight=0.5)(data)
    assert plain.sum(-1).tolist() == [1.0, 1.0]
    assert weighted.sum(-1).tolist() == [1.0 + 0.5 * 1.75, 1.0 + 0.5 * 0.5]
    assert weighted[1, 4] == 1.25  # on row 1's last model token


_ACTIVE, _PEAK, _EXPECTED_PEAK = [0], [0], [1]


def _slow_scorer(data_source, solution_str, ground_truth, extra_info=None):
    """Counts how many calls overlap (thread isolation shares this module's counters); a call stays in
    until ``_EXPECTED_PEAK`` calls have overlapped (at most BUDGET_S / 2), so that a late-starting thread
    on a loaded machine is still seen overlapping: serial calls never reach a peak above 1."""
    lock = globals().setdefault("_LOCK", threading.Lock())
    with lock:
        _ACTIVE[0] += 1
        _PEAK[0] = max(_PEAK[0], _ACTIVE[0])
    deadline = time.monotonic() + BUDGET_S / 2
    while _PEAK[0] < _EXPECTED_PEAK[0] and time.monotonic() < deadline:
        time.sleep(0.005)
    with lock:
        _ACTIVE[0] -= 1
    if "hang" in solution_str:
        _RELEASE.wait(HANG_S)
    return float(solution_str.endswith(str(ground_truth)))


def test_num_workers_scores_shares_at_once_in_row_order(tokenizer):
    texts = [f"x {i}" for i in range(9)] + ["x hang"]
    data = make_batch(tokenizer, texts, list(range(9)) + [0])

    def run(workers):
        _PEAK[0], _EXPECTED_PEAK[0] = 0, workers
        manager = NaiveRewardManager(tokenizer, 0, compute_score=_slow_scorer, timeout_s=BUDGET_S, isolation="thread",
                                     num_workers=workers)
        return manager(data, return_dict=True), _PEAK[0]

    (serial, serial_peak), (shared, shared_peak) = run(1), run(4)
    assert serial_peak == 1 and shared_peak == 4  # four shares scored at the same time
    assert torch.equal(serial["reward_tensor"], shared["reward_tensor"])  # the same scores, in row order
    assert shared["reward_tensor"].sum(1).tolist() == [1.0] * 9 + [0.0]
    assert shared["reward_metrics"]["reward/num_timeouts"] == 1  # the hung row alone
    with pytest.raises(ValueError, match="num_workers=0 must be >= 1"):
        NaiveRewardManager(tokenizer, 0, num_workers=0)
