"""A remote reward model over HTTP (``reward_model.model.path=http://host:port/path``; OpenRLHF's
``--remote_rm_url``).

Each request is ``POST <url>`` with a JSON body of up to ``batch_size`` rows::

    {"query": [prompt text + response text, ...], "prompts": [prompt text, ...],
     "responses": [response text, ...], "labels": [ground truth or null, ...],
     "messages": [[{"role": ..., "content": ...}, ..., {"role": "assistant", "content": response}], ...]}

(OpenRLHF's ``query`` / ``prompts`` / ``labels`` plus the pieces a service may prefer), and the
answer is ``{"rewards": [float, ...]}`` (or ``{"scores": [...]}``, or a bare list) with one finite
number per row. The reward guard's rules apply: a request that times out (``timeout_s``), fails
(connection, HTTP status, not JSON) or answers something else (wrong length, not a number, NaN) is
retried ``retries`` times, then its rows score 0.0 and count in ``reward/rm_num_{timeouts,errors,
invalid}``; the first failure of each kind is logged once. Training never stops on one bad answer;
``reward/rm_all_failed`` marks a step where every row failed (the trainer's health check stops
after ``trainer.max_consecutive_reward_failures`` such steps).
"""

from __future__ import annotations

import json
import logging
import math
import socket
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

__all__ = ["RemoteRewardModel", "RemoteRewardError"]

logger = logging.getLogger(__name__)


class RemoteRewardError(Exception):
    """One failed request: ``kind`` is timeout | error | invalid."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _parse(body: bytes, rows: int) -> list[float]:
    try:
        answer = json.loads(body)
    except ValueError as error:
        raise RemoteRewardError("invalid", f"the answer is not JSON ({error}): {body[:200]!r}") from None
    values = answer.get("rewards", answer.get("scores")) if isinstance(answer, dict) else answer
    if not isinstance(values, list) or len(values) != rows:
        raise RemoteRewardError("invalid", f"expected {{'rewards': [{rows} numbers]}}, got {str(answer)[:200]}")
    out = []
    for value in values:
        if isinstance(value, list) and len(value) == 1:  # [[r], ...]: a one-output head's logits
            value = value[0]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RemoteRewardError("invalid", f"reward {value!r} is not a finite number")
        out.append(float(value))
    return out


class RemoteRewardModel:
    """Scores rows by POSTing them to ``url`` (see the module docstring).

    Args:
        url: ``http(s)://`` endpoint.
        timeout_s: seconds one request may take.
        batch_size: rows per request.
        retries: further attempts after a failed request (0 = none).
        backoff_s: pause before the first retry (doubled each time).
        concurrency: requests in flight at once (``reward_model.num_workers``); 1 = one after another.
    """

    def __init__(self, url: str, timeout_s: float = 10.0, batch_size: int = 8, retries: int = 2,
                 backoff_s: float = 0.5, concurrency: int = 1):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward_model.model.path={url!r}: a remote reward model needs an http(s):// URL")
        self.url, self.timeout_s, self.batch_size = url, float(timeout_s), max(1, int(batch_size))
        self.retries, self.backoff_s = max(0, int(retries)), float(backoff_s)
        self.concurrency = max(1, int(concurrency))
        self._logged_kinds: set[str] = set()

    def _post(self, payload: dict[str, Any], rows: int) -> list[float]:
        request = urllib.request.Request(self.url, data=json.dumps(payload).encode("utf-8"),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
        except (socket.timeout, TimeoutError) as error:
            raise RemoteRewardError("timeout", f"no answer within reward_model.timeout={self.timeout_s} s ({error})")
        except urllib.error.HTTPError as error:
            raise RemoteRewardError("error", f"HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            kind = "timeout" if isinstance(reason, (socket.timeout, TimeoutError)) else "error"
            raise RemoteRewardError(kind, f"cannot reach {self.url}: {reason}") from None
        return _parse(body, rows)

    def _request(self, payload: dict[str, Any], rows: int) -> tuple[Optional[list[float]], Optional[RemoteRewardError]]:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return self._post(payload, rows), None
            except RemoteRewardError as error:
                last = error
                if attempt < self.retries:
                    time.sleep(delay)
                    delay *= 2
        return None, last

    def score(self, prompts: Sequence[str], responses: Sequence[str], labels: Sequence[Any] = (),
              messages: Sequence[list[dict]] = ()) -> tuple[list[float], dict[str, float]]:
        """``(rewards, metrics)``: one reward per row (0.0 where its request failed) and the
        ``reward/rm_num_*`` counts."""
        rows = len(prompts)
        labels = list(labels) or [None] * rows
        messages = list(messages) or [None] * rows
        rewards = [0.0] * rows
        failures: Counter = Counter()
        parts = [slice(start, min(start + self.batch_size, rows)) for start in range(0, rows, self.batch_size)]
        payloads = [{"query": [p + r for p, r in zip(prompts[part], responses[part])],
                     "prompts": list(prompts[part]), "responses": list(responses[part]),
                     "labels": labels[part], "messages": messages[part]} for part in parts]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(parts))),
                                thread_name_prefix="hybrid_rl-remote-rm") as pool:
            answers = list(pool.map(lambda k: self._request(payloads[k], parts[k].stop - parts[k].start),
                                    range(len(parts))))
        for part, (values, error) in zip(parts, answers):
            if values is not None:
                rewards[part] = values
                continue
            failures[error.kind] += part.stop - part.start
            if error.kind not in self._logged_kinds:  # once per kind, or a dead service floods the log
                self._logged_kinds.add(error.kind)
                logger.warning("remote reward model %s: %s (after %d attempts; its rows scored 0.0, further %s "
                               "failures are only counted in reward/rm_num_*)", self.url, error, self.retries + 1,
                               error.kind)
        failed = sum(failures.values())
        metrics = {"reward/rm_num_timeouts": failures["timeout"], "reward/rm_num_errors": failures["error"],
                   "reward/rm_num_invalid": failures["invalid"], "reward/rm_num_failed": failed,
                   "reward/rm_all_failed": float(rows > 0 and failed == rows)}
        return rewards, metrics
