"""Issue 57 item 2, slice 1: ``rows_from_calls`` turns every model call of a rollout into training rows
(``agent.rows: every_call``); expected ids, masks and log-probs written out by hand."""

import pytest

from hybrid_rl.agents.openai_agent import output_from_calls, rows_from_calls
from hybrid_rl.agents.openai_server import CallRecord

EOS = 2


def _calls():
    """A main conversation A -> C, a sub-agent's independent conversation B -> D, and a branch E of A (a
    retry of A's continuation with fewer tokens, so A -> C is A's row)."""
    return [
        CallRecord([1, 2], [3, EOS], [-1.0, -1.1], "completed", started=1),                       # 0: A
        CallRecord([50], [51, EOS], [-2.0, -2.1], "completed", started=2),                          # 1: B
        CallRecord([1, 2, 3, EOS, 9], [4, 5, EOS], [-3.0, -3.1, -3.2], "completed", parent=0, started=3),  # 2: C
        CallRecord([50, 51, EOS, 60], [61, EOS], [-4.0, -4.1], "completed", parent=1, started=4),   # 3: D
        CallRecord([1, 2, 3, EOS, 8], [EOS], [-5.0], "completed", parent=0, started=5),             # 4: E
    ]


def test_every_call_is_in_exactly_one_row_with_the_rollouts_score():
    rows = rows_from_calls(_calls(), {"reward": 1.0, "turns": 3})
    assert [r.prompt_ids for r in rows] == [[1, 2], [50], [1, 2, 3, EOS, 8]]
    assert [r.response_ids for r in rows] == [[3, EOS, 9, 4, 5, EOS], [51, EOS, 60, 61, EOS], [EOS]]
    assert [r.response_mask for r in rows] == [[1, 1, 0, 1, 1, 1], [1, 1, 0, 1, 1], [1]]
    assert rows[0].response_logprobs == [-1.0, -1.1, 0.0, -3.0, -3.1, -3.2]
    assert rows[1].response_logprobs == [-2.0, -2.1, 0.0, -4.0, -4.1] and rows[2].response_logprobs == [-5.0]
    assert [r.reward_score for r in rows] == [1.0] * 3
    assert rows[0].metrics == {"turns": 3.0, "calls": 5.0, "calls_off_row": 0.0, "rows": 3.0}
    sampled = sum(sum(r.response_mask) for r in rows)
    assert sampled == sum(len(c.completion_ids) for c in _calls())  # every sampled token trained once


def test_the_chain_mode_row_is_the_first_every_call_row_when_the_main_chain_starts_first():
    chain = output_from_calls(_calls(), 1.0)
    first = rows_from_calls(_calls(), 1.0)[0]
    assert (chain.prompt_ids, chain.response_ids, chain.response_mask) == (
        first.prompt_ids, first.response_ids, first.response_mask)
    assert chain.metrics == {"calls": 5.0, "calls_off_row": 3.0}  # B, D and E are off the chain mode's row


def test_a_single_call_gives_one_row_and_no_call_is_a_bad_return():
    from hybrid_rl.agents.agent_runner import AgentReturnError

    rows = rows_from_calls(_calls()[:1], None)
    assert len(rows) == 1 and rows[0].response_ids == [3, EOS] and rows[0].reward_score is None
    with pytest.raises(AgentReturnError, match="never called the model"):
        rows_from_calls([], 1.0)
