"""The producer is not 'stalled' while it loads offered weights: with eta = 0 the trainer waits for
the rollout after every push, and a load takes seconds; taking that window for a dead end stopped a
decoupled distillation run at step 3 ("the rollout waits for the trainer while the buffer holds 0
ready rows")."""

import threading

from hybrid_rl.buffer import MemoryBuffer
from hybrid_rl.trainer.ppo.producer import ProducerState, RolloutProducer
from tests.trainer.test_producer import ROWS, FakeLoader, Tok, fake_generate, fake_score, wait_until


def test_not_stalled_while_offered_weights_load():
    buffer, loading, release = MemoryBuffer(), threading.Event(), threading.Event()

    def load_weights(weights):
        if weights == "w1":  # the push after step 1: held until the test has looked
            loading.set()
            assert release.wait(10)
        return {"timing_s/weight_load": 0.0}

    producer = RolloutProducer(loader=FakeLoader(), state=ProducerState(1, {"position": 0}), generate=fake_generate,
                               score=fake_score, load_weights=load_weights, buffer=buffer, tokenizer=Tok(), eta=0,
                               taken_batches=0, ready_batches=0)
    producer.offer_weights("w0", 0)
    producer.start()
    try:
        wait_until(lambda: buffer.count("ready") == ROWS)  # batch 1, sampled by version 0
        buffer.take(ROWS, step=1)
        producer.consumed(1)
        producer.offer_weights("w1", 1)  # step 1's weights: batch 2 may start once they are loaded
        assert loading.wait(10)
        assert not producer.stalled()  # mid-load: the version is about to change, nothing is stuck
        release.set()
        wait_until(lambda: buffer.count("ready") == ROWS)
        assert producer.rollout_version == 1
    finally:
        release.set()
        producer.stop()
