"""RemoteRewardModel against a local HTTP server: the request body, batching, retries, and the guard's
handling of timeouts, HTTP errors and malformed answers (rows scored 0 and counted)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybrid_rl.reward.remote import RemoteRewardModel


class _Service:
    """A reward service whose behaviour a test sets: ``mode`` ok | slow | wait | http500 | not_json |
    short | nan | flaky (fails the first request, then answers)."""

    def __init__(self):
        self.mode, self.requests = "ok", []
        self.lock, self.active, self.peak, self.expected_peak = threading.Lock(), 0, 0, 1
        self.release = threading.Event()  # ends a "slow" request (set when its test ends)
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                service.requests.append(body)
                mode = service.mode
                if mode == "flaky":
                    mode = "http500" if len(service.requests) == 1 else "ok"
                if mode == "slow":
                    service.release.wait(60)  # far past the client's timeout
                if mode == "wait":  # counts the requests in flight at once; each stays until expected_peak
                    with service.lock:  # were in flight (at most 10 s: a late request on a loaded machine counts)
                        service.active += 1
                        service.peak = max(service.peak, service.active)
                    deadline = time.monotonic() + 10
                    while service.peak < service.expected_peak and time.monotonic() < deadline:
                        time.sleep(0.005)
                    with service.lock:
                        service.active -= 1
                if mode == "http500":
                    self.send_response(500)
                    self.end_headers()
                    return
                rewards = [float(len(r)) for r in body["responses"]]
                answer = {"not_json": b"<html>", "short": json.dumps({"rewards": rewards[:-1]}).encode(),
                          "nan": json.dumps({"rewards": [float("nan")] * len(rewards)}).encode()}.get(
                    mode, json.dumps({"rewards": rewards}).encode())
                self.send_response(200)
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def service():
    s = _Service()
    yield s
    s.server.shutdown()


def _score(service, mode, **kwargs):
    service.mode, service.requests = mode, []
    remote = RemoteRewardModel(service.url, **{"timeout_s": 30.0, "batch_size": 2, "retries": 1, "backoff_s": 0.01,
                                               **kwargs})
    return remote.score(["p1 ", "p2 ", "p3 "], ["a", "bb", "ccc"], labels=["1", None, "3"],
                        messages=[[{"role": "user", "content": "p"}]] * 3)


def test_rows_are_batched_and_scored_in_order(service):
    rewards, metrics = _score(service, "ok")
    assert rewards == [1.0, 2.0, 3.0]
    assert metrics["reward/rm_num_failed"] == 0 and metrics["reward/rm_all_failed"] == 0.0
    first = service.requests[0]
    assert first["query"] == ["p1 a", "p2 bb"] and first["prompts"] == ["p1 ", "p2 "] and first["labels"] == ["1", None]
    assert len(service.requests) == 2 and service.requests[1]["responses"] == ["ccc"]


def test_num_workers_requests_in_flight_at_once_in_row_order(service):
    for concurrency, peak in ((1, 1), (2, 2)):
        service.peak, service.expected_peak = 0, peak
        rewards, metrics = _score(service, "wait", concurrency=concurrency, batch_size=1)
        assert rewards == [1.0, 2.0, 3.0] and metrics["reward/rm_num_failed"] == 0
        assert service.peak == peak and len(service.requests) == 3


def test_a_failed_request_is_retried(service):
    rewards, metrics = _score(service, "flaky")
    assert rewards == [1.0, 2.0, 3.0] and metrics["reward/rm_num_failed"] == 0
    assert len(service.requests) == 3  # the first request twice


@pytest.mark.parametrize("mode, kind", [("slow", "timeouts"), ("http500", "errors"), ("not_json", "invalid"),
                                        ("short", "invalid"), ("nan", "invalid")])
def test_failures_score_zero_and_are_counted(service, mode, kind):
    service.release.clear()
    try:  # only the request that must time out gets a short timeout
        rewards, metrics = _score(service, mode, **({"timeout_s": 0.5} if mode == "slow" else {}))
    finally:
        service.release.set()
    assert rewards == [0.0, 0.0, 0.0]
    assert metrics[f"reward/rm_num_{kind}"] == 3 and metrics["reward/rm_num_failed"] == 3
    assert metrics["reward/rm_all_failed"] == 1.0


def test_an_unreachable_service_is_an_error_not_a_crash():
    remote = RemoteRewardModel("http://127.0.0.1:9/score", timeout_s=0.5, retries=0)
    rewards, metrics = remote.score(["p"], ["r"])
    assert rewards == [0.0] and metrics["reward/rm_num_errors"] == 1


def test_a_url_is_required():
    with pytest.raises(ValueError, match="needs an http"):
        RemoteRewardModel("/models/rm")
