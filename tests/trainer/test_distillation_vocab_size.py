"""The start-up check on the models' logit widths (``config.vocab_size``): the tokenizer check passes a
teacher whose vocabulary is padded differently, so the sizes are checked too, one line each."""

import pytest

from hybrid_rl.trainer import get_config
from hybrid_rl.trainer.config.checks import validate_config
from hybrid_rl.trainer.config.loader import to_ppo_config
from hybrid_rl.utils.testing import build_tiny_model_dir

KEY = "distillation.teacher_models.teacher_model.model_path"


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """The student (tiny_model_dir) has vocab_size 320 and the 259-token byte tokenizer: the same
    tokenizer with 384 (padded wider) and 300 (narrower) logits."""
    root = tmp_path_factory.mktemp("vocab_teachers")
    return {size: build_tiny_model_dir(root / str(size), seed=1, vocab_size=size) for size in (300, 384)}


def _cfg(student, teacher, *overrides):
    return to_ppo_config(get_config([f"actor_rollout_ref.model.path={student}", "distillation.enabled=true",
                                     f"{KEY}={teacher}", *overrides]))


def _problems(cfg):
    with pytest.raises(ValueError) as info:
        validate_config(cfg)
    return [line for line in str(info.value).splitlines() if "distillation" in line]


def test_a_narrower_teacher_is_refused_for_every_loss(tiny_model_dir, teachers):
    for mode in ("k3", "forward_kl_topk"):
        (line,) = _problems(_cfg(tiny_model_dir, teachers[300], f"distillation.distillation_loss.loss_mode={mode}"))
        assert line.startswith(f"{KEY}=") and "config.vocab_size 300 is smaller than the student's 320" in line


def test_a_padded_teacher_passes_for_every_loss(tiny_model_dir, teachers):
    """Wider teacher logits (Qwen2.5-7B's 152064 over 0.5B's 151936): every sampled id has a teacher
    logit, and a top-K loss picks the teacher's K below the student's width (test_topk_vocab_limit)."""
    for mode in ("k3", "forward_kl_topk"):
        validate_config(_cfg(tiny_model_dir, teachers[384], f"distillation.distillation_loss.loss_mode={mode}"))


def test_the_same_size_passes_with_a_top_k_loss(tiny_model_dir, tmp_path):
    teacher = build_tiny_model_dir(tmp_path / "same", seed=1)
    validate_config(_cfg(tiny_model_dir, teacher, "distillation.distillation_loss.loss_mode=forward_kl_topk"))
