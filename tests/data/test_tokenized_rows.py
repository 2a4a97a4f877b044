"""tokenize_rows: the bad-rows loop every tokenised dataset shares."""

import pytest

from hybrid_rl.data.bad_rows import BadRows
from hybrid_rl.data.tokenized import tokenize_rows


def _tokenize(text: str) -> list[int]:
    if len(text) > 3:
        raise ValueError("too long. Fix: shorten it")
    return [ord(c) - ord("a") for c in text]


def _loaded(policy: BadRows, texts: list[str]):
    for index, text in enumerate(texts, start=1):
        policy.seen += 1  # what a loader does for each row it reads
        yield "f.jsonl", index, text


def test_keeps_good_rows_in_order_and_skips_bad_ones():
    policy = BadRows("skip", 0.5, what="rows")
    items, rows = tokenize_rows(_loaded(policy, ["ab", "abcd", "c"]), policy, _tokenize, "empty")
    assert items == ["ab", "c"]
    assert rows == [[0, 1], [2]]
    assert policy.seen == 3  # a tokenising failure is not a second row
    assert policy.skipped == [("f.jsonl", "row 2", "too long")]


def test_error_mode_names_file_and_row():
    policy = BadRows("error")
    with pytest.raises(ValueError, match=r"^f.jsonl, row 2: too long. Fix: shorten it$"):
        tokenize_rows(_loaded(policy, ["ab", "abcd"]), policy, _tokenize, "empty")


def test_nothing_left_is_refused_with_the_callers_line():
    policy = BadRows("skip", 0.99)
    with pytest.raises(ValueError, match=r"^no rows in x. Fix: pass non-empty files.$"):
        tokenize_rows(_loaded(policy, []), policy, _tokenize, "no rows in x. Fix: pass non-empty files.")


def test_too_many_bad_rows_fail_in_finish():
    policy = BadRows("skip", 0.4)
    with pytest.raises(ValueError, match=r"left out 1 of 2 rows"):
        tokenize_rows(_loaded(policy, ["ab", "abcd"]), policy, _tokenize, "empty")
