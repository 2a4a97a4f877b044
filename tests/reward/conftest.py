"""Each test starts with no abandoned scorer threads counted (hung sleepers of earlier tests may
still be running in the background; they must not make later thread-mode tests refuse work)."""

import pytest

from hybrid_rl.reward import _isolation


@pytest.fixture(autouse=True)
def _fresh_abandoned_thread_count(monkeypatch):
    monkeypatch.setattr(_isolation, "_abandoned_threads", [])


@pytest.fixture(autouse=True)
def _release_hung_scorers():
    """Each test's hung thread-mode scorers (waiting on ``hang.RELEASE``) end with the test."""
    from tests.reward.hang import RELEASE

    RELEASE.clear()
    yield
    RELEASE.set()
