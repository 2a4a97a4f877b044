"""Start-up checks of ``distillation.*``: the settings, each teacher's folder, weights and vocabulary.

A teacher scores the student's token ids, so both must mean the same token by the same id: the
teacher's tokenizer vocabulary must equal the student's, and the models' logit widths
(``config.vocab_size``, often padded past the tokenizer) must fit: the teacher needs a logit for every
id the student can sample (teacher's >= student's). A teacher padded wider is fine: a top-K loss picks
the teacher's K among the student's ids (``workers/topk_forward.response_topk``'s ``vocab_limit``), as
Qwen2.5-0.5B (151936) under a 7B teacher (152064) needs. Checked here, before any worker starts.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from hybrid_rl.trainer.config.run_checks import check_model_path
from hybrid_rl.workers.weights_check import needs_remote_code

__all__ = ["check_distillation", "config_vocab_size", "needs_remote_code", "vocab_size_problem", "vocabulary_problem",
           "weights_problems"]


def _json(path: str) -> Any:
    """The JSON in ``path``; None when it is missing or unreadable (the folder checks report that)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def vocabulary_problem(key: str, teacher_path: str, student_path: str, trust_remote_code: bool = False) -> list[str]:
    """One line when the tokenizers at the two model paths map tokens to ids differently. Tokenizers are
    loaded without remote code; with ``trust_remote_code`` on, a folder that names code of its own
    (:func:`needs_remote_code`) is not compared (the check never imports a model folder's code)."""
    from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path

    try:
        folders = resolve_model_path(teacher_path, key=key), resolve_model_path(student_path)
        if trust_remote_code and any(needs_remote_code(folder) for folder in folders):
            return []
        teacher, student = (load_tokenizer(folder, trust_remote_code=False) for folder in folders)
    except (OSError, ValueError) as e:
        return [f"{key}={teacher_path!r}: its tokenizer could not be loaded ({type(e).__name__}: "
                f"{str(e).splitlines()[0]}); point it at a model folder with tokenizer files."]
    t_vocab, s_vocab = teacher.get_vocab(), student.get_vocab()
    if t_vocab == s_vocab:
        return []
    differ = sorted(set(t_vocab.items()) ^ set(s_vocab.items()), key=lambda item: item[1])[:3]
    return [f"{key}={teacher_path!r}: the teacher's vocabulary ({len(t_vocab)} tokens) is not the student's "
            f"({len(s_vocab)} tokens; first differences {differ}). The teacher scores the student's token ids, "
            "so both must share one tokenizer: pick a teacher of the student's model family."]


def config_vocab_size(folder: str, override: Any = None) -> Optional[int]:
    """The logit width ``config.json`` of the model folder ``folder`` states (``vocab_size``, or its text
    model's, ``text_config.vocab_size``, for a multimodal config), ``override["vocab_size"]`` when given;
    read as JSON, never through transformers (which would import the folder's code). None when unstated."""
    override = dict(override or {})
    config = _json(os.path.join(folder, "config.json"))
    if "vocab_size" in override:
        size = override["vocab_size"]
    elif not isinstance(config, dict):
        return None
    else:
        text = config.get("text_config")
        size = text.get("vocab_size") if isinstance(text, dict) and "vocab_size" in text else config.get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def vocab_size_problem(key: str, teacher_path: str, student_path: str, *, student_override: Any = None) -> list[str]:
    """One line when the models' ``config.vocab_size`` do not fit (module docstring); none when either
    size cannot be read (the folder checks report that)."""
    from hybrid_rl.workers.model_loader import resolve_model_path

    try:
        teacher = config_vocab_size(resolve_model_path(teacher_path, key=key))
        student = config_vocab_size(resolve_model_path(student_path), student_override)
    except (OSError, ValueError):
        return []
    if teacher is None or student is None or teacher == student:
        return []
    if teacher < student:
        return [f"{key}={teacher_path!r}: the teacher's config.vocab_size {teacher} is smaller than the student's "
                f"{student}, so a student token id >= {teacher} has no teacher logit; use a teacher whose vocab_size "
                f"is at least {student}."]
    return []


def weights_problems(key: str, path: str, trust_remote_code: bool) -> list[str]:
    """The teacher folder's weights, read from their headers (none to read for the embedded model)."""
    from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID, resolve_model_path
    from hybrid_rl.workers.weights_check import weights_problem

    if path == EMBEDDED_MODEL_ID:
        return []
    try:
        problem = weights_problem(resolve_model_path(path, key=key), key, trust_remote_code)
    except (OSError, ValueError, KeyError) as e:  # transformers cannot read its config.json (an unknown model type)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return [f"{key}={path!r}: transformers cannot read its config.json ({type(e).__name__}: {reason}). Fix: "
                "point it at a model folder this transformers version knows, or upgrade transformers."]
    return [problem] if problem else []


def check_distillation(cfg: Any) -> list[str]:
    """``distillation.*`` of a PPO config: settings, the modes it runs in, teacher folders, vocabularies."""
    d = cfg.distillation
    errors = d.problems()
    if not d.enabled or errors:
        return errors
    model = cfg.actor_rollout_ref.model
    student = model.tokenizer_path or model.path
    remote = bool(model.trust_remote_code)
    for name, teacher in d.active_teachers().items():
        key = f"distillation.teacher_models.{name}.model_path"
        problems = check_model_path(key, teacher.model_path, model.trust_remote_code)
        errors.extend(problems or weights_problems(key, teacher.model_path, remote)
                      or vocabulary_problem(key, teacher.model_path, student, remote)
                      or vocab_size_problem(key, teacher.model_path, model.path,
                                            student_override=model.override_config))
    return errors
