"""The devices a run may name (``trainer.device``) and how ``auto`` resolves."""

from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(requested: str) -> str:
    """``trainer.device`` -> cpu | cuda (auto = cuda when available)."""
    import torch

    if requested not in DEVICES:
        raise ValueError(f"trainer.device={requested!r} must be one of {DEVICES}")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested
