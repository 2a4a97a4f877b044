"""Exact scores of the built-in scorers on hand-written good, bad, malformed and adversarial strings."""

import time

import pytest

from hybrid_rl.reward.scorers import arithmetic, gsm8k, math as math_scorer


@pytest.mark.parametrize(
    "solution, ground_truth, expected",
    [
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),
        ("#### 1,234", "1234", 1.0),  # commas stripped
        ("#### $1,234", "1234", 1.0),  # dollar sign stripped
        ("#### 1234", "1,234", 1.0),  # ground truth normalised the same way
        ("#### -5", "-5", 1.0),
        ("#### 72\nthen later #### 73", "72", 0.0),  # the LAST answer counts
        ("#### 71", "72", 0.0),  # well-formatted but wrong -> format_score (0.0)
        ("The answer is 72", "72", 0.0),  # strict needs ####
        ("####72", "72", 0.0),  # veRL's strict regex requires the space
        ("#### 72.5", "72", 0.0),
        ("", "72", 0.0),
        ("#### 72" + "x" * 300, "72", 0.0),  # answer outside the final 300 characters
        ("x" * 10_000 + "#### 72", "72", 1.0),
        ("#### ٧٢", "72", 0.0),  # Arabic-Indic digits are not ASCII digits
    ],
)
def test_gsm8k_strict(solution, ground_truth, expected):
    assert gsm8k.compute_score(solution, ground_truth) == expected


def test_gsm8k_format_score_and_flexible():
    assert gsm8k.compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no answer", "72", format_score=0.1) == 0.0
    assert gsm8k.compute_score("so it is 7 then 72.", "72", method="flexible") == 0.0  # "72." != "72", as veRL
    assert gsm8k.compute_score("so it is 7 then 72 .", "72", method="flexible") == 1.0
    assert gsm8k.compute_score("1,000 apples", "1000", method="flexible") == 1.0
    assert gsm8k.compute_score("no digits here . ,", "1", method="flexible") == 0.0
    assert gsm8k.extract_solution("a 3 b -4 c", method="flexible") == "-4"
    with pytest.raises(ValueError, match="strict"):
        gsm8k.compute_score("#### 1", "1", method="loose")


@pytest.mark.parametrize(
    "solution, ground_truth, expected",
    [
        (r"so $x = \boxed{\frac{1}{2}}$", r"\frac{1}{2}", 1.0),  # string fast path
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),  # math-verify equivalence
        (r"\boxed{\dfrac12}", "0.5", 1.0),
        (r"\boxed{2} and finally \boxed{3}", "3", 1.0),  # last box
        (r"\boxed{3} and finally \boxed{2}", "3", 0.0),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1.0),  # nested braces
        (r"\fbox{7}", "7", 1.0),
        (r"\boxed {7}", "7", 1.0),
        ("the answer is 7", "7", 0.0),  # no box
        (r"\boxed{7", "7", 0.0),  # unbalanced
        (r"\boxed{}", "7", 0.0),
        (r"\boxed{x^2+1}", "x^2 + 1", 1.0),
        (r"\boxed{x^2+2}", "x^2 + 1", 0.0),
        (r"\boxed{π}", r"\pi", 1.0),  # unicode
        (r"\boxed{\frac{1}{2}}", r"$\boxed{\frac{1}{2}}$", 1.0),  # boxed / $-wrapped ground truth
    ],
)
def test_math(solution, ground_truth, expected):
    assert math_scorer.compute_score(solution, ground_truth) == expected


def test_math_box_extraction_and_adversarial_inputs():
    assert math_scorer.last_boxed_content(r"a \boxed{{a}{b{c}}} b") == "{a}{b{c}}"
    assert math_scorer.last_boxed_content(r"\boxed{1} \boxed{") is None  # malformed final box
    assert math_scorer.last_boxed_content(r"\boxed x") is None
    assert math_scorer.compute_score(r"\boxed{3}", "3", score=2.0) == 2.0
    assert math_scorer.compute_score(r"\boxed{4}", "3", format_score=0.1) == 0.1
    assert math_scorer.compute_score(None, "3") == 0.0
    assert math_scorer.compute_score(r"\boxed{" + "1+" * 2000 + "1}", "3") == 0.0  # over MAX_ANSWER_CHARS
    assert math_scorer.compute_score(r"\boxed{\frac{1}{0}}", "3") == 0.0
    assert math_scorer.compute_score(r"\boxed{\left(\right}", "3") == 0.0
    start = time.perf_counter()
    huge = "{" * 1_000_000 + r"\boxed{" + "{" * 1_000_000  # never balanced
    assert math_scorer.compute_score(huge, "3") == 0.0
    assert math_scorer.compute_score("x" * 5_000_000 + r"\boxed{3}", "3") == 1.0
    assert time.perf_counter() - start < 30.0  # linear scans (~0.5 s quiet); a quadratic scan would take hours


@pytest.mark.parametrize(
    "solution, ground_truth, expected",
    [
        ("3 + 4 = 7\n#### 7", 7, 1.0),
        ("#### 7", "7", 1.0),
        ("#### -12", -12, 1.0),
        ("####-12", -12, 1.0),
        ("####   - 12", -12, 1.0),
        ("#### 1,234", 1234, 1.0),
        ("#### 1234", "1,234", 1.0),
        ("#### 7.", 7, 1.0),  # sentence-ending period
        ("#### 7.0", 7, 1.0),
        ("#### 7.5", 7, 0.0),  # not an integer
        ("#### 8", 7, 0.0),
        ("#### 7 ... no wait #### 8", 7, 0.0),  # last answer counts
        ("#### 8 ... no wait #### 7 ####", 7, 1.0),  # a trailing bare #### is not an answer
        ("The answer is 7", 7, 0.0),
        ("#### seven", 7, 0.0),
        ("#### ٧", 7, 0.0),  # non-ASCII digit
        ("#### 7", "not a number", 0.0),
        ("", 7, 0.0),
        ("#### " + "9" * 5000, int("9" * 400), 0.0),  # beyond int()'s digit limit: no crash
    ],
)
def test_arithmetic(solution, ground_truth, expected):
    assert arithmetic.compute_score(solution, ground_truth) == expected


def test_arithmetic_format_score_and_adversarial_inputs():
    assert arithmetic.compute_score("#### 8", 7, format_score=0.1) == 0.1
    assert arithmetic.compute_score("nothing", 7, format_score=0.1) == 0.0
    assert arithmetic.compute_score(b"#### 7", 7) == 0.0  # not a str
    start = time.perf_counter()
    assert arithmetic.compute_score("####" + " " * 2_000_000 + "x", 7) == 0.0  # no quadratic backtracking
    assert arithmetic.compute_score("#### 1 " * 200_000 + "#### 7", 7) == 1.0
    assert time.perf_counter() - start < 30.0  # shared machine: generous, quadratic would be hours
