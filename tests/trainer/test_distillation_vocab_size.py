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


def build_code_folder(model_dir, folder, marker):
    """A copy of ``model_dir`` whose config.json and tokenizer_config.json name code of their own
    (``auto_map``): importing either module writes ``marker``."""
    import json
    import shutil

    shutil.copytree(model_dir, folder)
    for module, base, name in (("evil_cfg", "LlamaConfig", "config.json"),
                               ("evil_tok", "PreTrainedTokenizerFast", "tokenizer_config.json")):
        (folder / f"{module}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text({module!r})\n"
                                             f"from transformers import {base}\nclass Evil({base}):\n    pass\n")
        data = json.loads((folder / name).read_text())
        data["auto_map"] = ({"AutoConfig": "evil_cfg.Evil"} if module == "evil_cfg"
                            else {"AutoTokenizer": ["evil_tok.Evil", None]})
        (folder / name).write_text(json.dumps(data))
    return str(folder)


def test_the_checks_never_import_a_model_folders_code(tiny_model_dir, tmp_path):
    """trust_remote_code=true lets the run's workers import a model folder's code; the start-up checks
    (run by the studio's /api/check too) read config.json as JSON and leave such a tokenizer uncompared."""
    marker = tmp_path / "IMPORTED"
    evil = build_code_folder(tiny_model_dir, tmp_path / "evil", marker)
    remote = "actor_rollout_ref.model.trust_remote_code=true"
    validate_config(_cfg(tiny_model_dir, evil, remote))  # the teacher's code
    validate_config(_cfg(evil, tiny_model_dir, remote))  # the student's
    assert not marker.exists()


def test_config_vocab_size_reads_the_json(tmp_path):
    import json

    from hybrid_rl.trainer.config.distillation_checks import config_vocab_size

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 7, "text_config": {"vocab_size": 11}}))
    assert config_vocab_size(str(tmp_path)) == 11  # a multimodal config: its text model's logits
    assert config_vocab_size(str(tmp_path), {"vocab_size": 13}) == 13
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 7}))
    assert config_vocab_size(str(tmp_path)) == 7
    (tmp_path / "config.json").write_text("{not json")
    assert config_vocab_size(str(tmp_path)) is None


def test_a_config_transformers_cannot_read_is_one_line_under_the_teachers_key(tiny_model_dir, tmp_path):
    """trust_remote_code=true lets an unknown model_type past the causal-LM check; transformers' own error
    used to escape the checks (the studio filed it under no key)."""
    import json
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "odd")
    config = json.loads((tmp_path / "odd" / "config.json").read_text())
    (tmp_path / "odd" / "config.json").write_text(json.dumps({**config, "model_type": "no_such_type"}))
    (line,) = _problems(_cfg(tiny_model_dir, str(tmp_path / "odd"), "actor_rollout_ref.model.trust_remote_code=true"))
    assert line.startswith(f"{KEY}=") and "transformers cannot read its config.json (ValueError" in line
