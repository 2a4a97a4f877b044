"""``DecoupledPPOTrainer.take_experiences`` without Ray: a group that streams in stale while the trainer
waits for a batch is never trained (the staleness bound holds on every trained row), and the step takes
whole groups of fresh rows."""

from types import SimpleNamespace

from hybrid_rl.buffer import Experience, MemoryBuffer
from hybrid_rl.trainer.ppo.decoupled import DecoupledPPOTrainer
from hybrid_rl.trainer.ppo.stream_producer import StreamingProducer

N, ROWS, ETA = 2, 4, 1


def _group(version: int, uid: str) -> list[Experience]:
    return [Experience(uid=uid, data_source="d", prompt_ids=[1], response_ids=[7], response_mask=[1], reward=0.0,
                       policy_version=version, extra={"rollout_batch": 1}) for _ in range(N)]


class LateBuffer(MemoryBuffer):
    """While the trainer waits (its first look at the ready rows, after its first drop), a stale group and
    a fresh one stream in."""

    def __init__(self):
        super().__init__()
        self.arrived = False

    def count(self, status=None):
        if status == "ready" and not self.arrived:
            self.arrived = True
            self.put(_group(3, "late") + _group(6, "next"))
        return super().count(status)


class Producer(StreamingProducer):
    def __init__(self):  # no threads: only what take_experiences calls
        self.dropped, self.taken = [], 0

    def check(self):
        pass

    def stalled(self):
        return False

    def consumed(self, batches):
        self.taken += batches

    def dropped_rows(self, rows, rows_per_group):
        self.dropped.append(rows)

    def pop_metrics(self, indices):
        return {}

    @property
    def rollout_version(self):
        return 6


def _trainer(buffer) -> DecoupledPPOTrainer:
    trainer = object.__new__(DecoupledPPOTrainer)
    trainer.buffer, trainer.producer, trainer.eta, trainer.rows_per_batch = buffer, Producer(), ETA, ROWS
    trainer.global_steps, trainer.dropped_total, trainer.discarded_newer = 7, 0, 0
    trainer.tokenizer = SimpleNamespace(pad_token_id=0)
    trainer.config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(n=N, response_length=4)),
                                     trainer=SimpleNamespace(save_freq=1))
    return trainer


def test_a_group_streaming_in_stale_while_the_trainer_waits_is_dropped_not_trained():
    buffer = LateBuffer()
    buffer.put(_group(5, "fresh") + _group(2, "old"))  # "old" is stale before the wait, "fresh" is not
    trainer = _trainer(buffer)
    metrics = {}
    batch = trainer.take_experiences(None, metrics)
    assert sorted(set(batch.non_tensor_batch["uid"])) == ["fresh", "next"]
    assert all((7 - 1) - int(v) <= ETA for v in batch.non_tensor_batch["policy_version"])
    assert trainer.producer.dropped == [N, N] and metrics["async/dropped_stale"] == 2 * N
    assert {e.uid for e in buffer.read("dropped")} == {"old", "late"}
