"""The studio's test clients: FastAPI's test client as a browser on this machine would be, token included."""

from __future__ import annotations

from typing import Any, Callable

import pytest

TOKEN = "studio-test-token-0123456789"
"""The fixed token the tests' studios use (a real start draws a random one)."""


@pytest.fixture(scope="session")
def local_client() -> Callable[..., Any]:
    """``local_client(app, token=TOKEN)``: a test client from 127.0.0.1 addressing ``http://127.0.0.1``
    (what a loopback-bound studio serves) that sends ``token`` in ``X-Studio-Token`` (None: no token)."""
    pytest.importorskip("httpx", reason="FastAPI's test client needs httpx")
    from fastapi.testclient import TestClient

    def make(app: Any, token: Any = TOKEN, peer: str = "127.0.0.1", base_url: str = "http://127.0.0.1") -> Any:
        headers = {"X-Studio-Token": token} if token else {}
        return TestClient(app, base_url=base_url, client=(peer, 50000), headers=headers)

    return make
