"""Interactions: a simulated user or environment that answers the model when it stops without a tool call.

The interface is veRL's ``BaseInteraction`` (``verl/interactions/base.py``): the row's
``extra_info.interaction_kwargs`` (with ``name`` choosing the interaction) go to ``start_interaction``;
after each model turn that calls no tool, ``generate_response(instance_id, messages)`` returns
``(should_terminate, response_text, turn_score, metadata)``; the text becomes the next user turn
(masked from the loss), the score is appended to the row's ``turn_scores``. hybrid_rl also calls
``finalize_interaction`` when the trajectory ends (veRL's agent loop does not).
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Optional

from hybrid_rl.agents.tool import class_registry

__all__ = ["BaseInteraction", "get_interaction_cls", "register_interaction", "registered_interactions"]


class BaseInteraction:
    """Subclass and override ``generate_response`` (and the others as needed).

    Args:
        config: the ``config`` mapping of the interaction's YAML entry, plus ``name``.
    """

    def __init__(self, config: Optional[dict] = None):
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        """Start one conversation; returns its id."""
        return instance_id or str(uuid.uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict]:
        """(should_terminate, response text, turn score, metadata) after the model's latest turn."""
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """Score of the whole conversation (not used by the rollout; for custom scorers)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Free the conversation's state."""


_INTERACTIONS = class_registry("interaction",
                               "actor_rollout_ref.rollout.multi_turn.interaction_config_path: interaction[].class_name")


def register_interaction(name: str) -> Callable[[type], type]:
    """Class decorator: make an interaction available as ``class_name: <name>`` in the interaction YAML."""
    from hybrid_rl.agents.tool import registrar

    return registrar(_INTERACTIONS, BaseInteraction, "interaction", name, "generate_response")


def registered_interactions() -> list[str]:
    """Names registered with :func:`register_interaction`."""
    return _INTERACTIONS.names()


def get_interaction_cls(class_name: str, where: str) -> type:
    """A registered interaction name or a dotted import path, resolved to the class."""
    if class_name in _INTERACTIONS:
        return _INTERACTIONS.get(class_name)
    from hybrid_rl.agents.tool import import_class

    return import_class(class_name, BaseInteraction, "generate_response", where, "interaction",
                        registered_interactions())
