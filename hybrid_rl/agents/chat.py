"""Tokenizing observations (tool results, interaction replies) as deltas through the chat template.

The trajectory is token-in, token-out: the model's tokens are kept exactly as sampled, and only the
*new* messages are rendered and encoded. The delta is the text the chat template puts after an
assistant turn's end-of-turn token for the new messages, including the next assistant header
(``add_generation_prompt``), e.g. for ChatML::

    <|im_end|>  |  "\\n<|im_start|>tool\\n14582<|im_end|>\\n<|im_start|>assistant\\n"
    (sampled)   |  the delta, encoded on its own (response_mask 0)

It is found by rendering a fixed reference conversation ``[user, assistant(SENTINEL)]`` with and
without the new messages: what follows the sentinel and the end-of-turn token is the delta. Departure
from veRL's agent loop, which encodes the new messages alone and strips the template's system prefix:
that drops the newline ChatML puts after ``<|im_end|>``, so training would see a sequence the template
never produces; here the ids are exactly those of the templated conversation.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ObservationEncoder"]

_SENTINEL = "HYBRID_RL_ASSISTANT_TURN_7F3A"
_KEY = "actor_rollout_ref.rollout.multi_turn.enable"


class ObservationEncoder:
    """Encodes the messages that follow an assistant turn as the token ids the chat template gives them.

    Args:
        tokenizer: a HF tokenizer with a ``chat_template``.
        end_of_turn: the texts that may end an assistant turn as sampled (the EOS tokens' texts, e.g.
            ``<|im_end|>``); the one the template puts right after an assistant's content is used.
    """

    def __init__(self, tokenizer: Any, end_of_turn: str | list[str]):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{_KEY}=true needs a tokenizer with a chat template (tool results are rendered "
                             "through it), and this tokenizer has none. Fix: use an instruct/chat model, or a "
                             "tokenizer folder with a chat_template (data.tokenizer).")
        self.tokenizer = tokenizer
        self._base = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
        rendered = self._render(self._base, add_generation_prompt=False)
        cut = rendered.find(_SENTINEL)
        if cut < 0:
            raise ValueError(f"{_KEY}=true: the tokenizer's chat template drops the assistant's content, so "
                             "turns cannot be continued. Fix: use a chat template that renders assistant turns.")
        cut += len(_SENTINEL)
        candidates = [end_of_turn] if isinstance(end_of_turn, str) else list(end_of_turn)
        self.end_of_turn = next((text for text in candidates if text and rendered.startswith(text, cut)), "")
        """The text the template puts right after an assistant's content (what a turn cut short lacks)."""
        self._prefix = rendered[:cut + len(self.end_of_turn)]

    def check_roles(self, roles: list[str]) -> None:
        """Raise a one-line ValueError unless the template can render a ``role`` turn after an assistant
        turn for each of ``roles`` (``tool`` for tools, ``user`` for interactions)."""
        for role in roles:
            try:
                self.delta_text([{"role": role, "content": "x"}])
            except ValueError:
                raise
            except Exception as exc:  # jinja's TemplateError, or raise_exception() in the template
                raise ValueError(f"{_KEY}=true: the tokenizer's chat template cannot render a {role!r} turn after "
                                 f"an assistant turn ({type(exc).__name__}: {str(exc)[:120]}). Fix: use a chat model "
                                 f"whose template supports {role!r} messages.") from None

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False)

    def delta_text(self, messages: list[dict[str, Any]]) -> str:
        """The text the template adds after an assistant turn for ``messages`` and the next assistant header."""
        rendered = self._render(self._base + list(messages), add_generation_prompt=True)
        if not rendered.startswith(self._prefix):
            raise ValueError(f"{_KEY}=true: the chat template renders earlier turns differently once a "
                             f"{messages[0].get('role')!r} message follows, so the sampled tokens cannot be kept. "
                             "Fix: use a chat template that only appends new turns.")
        return rendered[len(self._prefix):]

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of :meth:`delta_text` (encoded without extra special tokens)."""
        return list(self.tokenizer(self.delta_text(messages), add_special_tokens=False)["input_ids"])
