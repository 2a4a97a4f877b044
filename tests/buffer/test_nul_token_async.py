"""A sampled NUL token ("\\x00": SmolLM2's token 190 decodes to it) goes through the decoupled mode's
producer into a SQL buffer and back to the trainer unchanged, on SQLite and PostgreSQL: through the
producer with a generation that emits it, and in a whole async run of a tiny model that samples it."""

import math

import numpy as np
import pytest
import torch

from hybrid_rl.buffer import SQLBuffer, batch_from_experiences
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.ppo.producer import ProducerState, RolloutProducer
from hybrid_rl.utils.testing import build_byte_tokenizer
from tests.trainer.test_producer import ROWS, FakeLoader, wait_until

NUL = "\x00"


@pytest.fixture
def database(request, tmp_path):
    """A SQLite file or a new PostgreSQL database (``request.param``)."""
    return str(tmp_path / "exp.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def nul_id(tokenizer) -> int:
    (token,) = tokenizer(NUL, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode([token]) == NUL
    return token


def generation_with_nul(nul):
    """A rollout whose every response is NUL, a byte, EOS; the first row's NUL had log-prob -inf."""

    def generate(batch, index, metrics):
        prompts = batch.batch["input_ids"]  # [ROWS, 2]
        responses = torch.tensor([[nul, 70 + i, 2] for i in range(ROWS)])  # [ROWS, 3]
        log_probs = torch.full((ROWS, 3), -0.5)
        log_probs[0, 0] = -math.inf
        return DataProto.from_dict(
            tensors={"prompts": prompts, "responses": responses, "response_mask": torch.ones(ROWS, 3, dtype=torch.long),
                     "attention_mask": torch.ones(ROWS, 5, dtype=torch.long), "rollout_log_probs": log_probs},
            non_tensors={"uid": np.array([f"{index}-{i // 2}" for i in range(ROWS)], dtype=object),
                         "extra_info": np.array([{"answer": f"a{NUL}b", "score": math.nan}] * ROWS, dtype=object)})

    return generate


def score_nan_first(batch, metrics):
    scores = torch.zeros(len(batch), 3)
    scores[:, 2] = torch.arange(len(batch), dtype=torch.float32)
    scores[0, 2] = math.nan  # a reward function's NaN, kept as it is
    batch.batch["token_level_scores"] = scores
    return batch


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_the_producer_puts_a_nul_token_and_the_trainer_takes_it_back(database):
    tokenizer = build_byte_tokenizer()
    nul = nul_id(tokenizer)
    buffer = SQLBuffer(database)
    producer = RolloutProducer(
        loader=FakeLoader(), state=ProducerState(1, {"position": 0}), generate=generation_with_nul(nul),
        score=score_nan_first, load_weights=lambda weights: {"timing_s/weight_load": 0.0}, buffer=buffer,
        tokenizer=tokenizer, eta=0, taken_batches=0, ready_batches=0)
    producer.offer_weights("w0", 0)
    producer.start()
    try:
        wait_until(lambda: buffer.count("ready") >= ROWS or producer.error is not None, timeout_s=60)
        producer.check()  # the producer did not die on the row (it did on PostgreSQL before the codec)
        taken = buffer.take(ROWS, step=1)
    finally:
        producer.stop()
    assert [e.response_text for e in taken] == [NUL + tokenizer.decode([70 + i]) for i in range(ROWS)]  # EOS dropped
    assert all(e.extra["extra_info"]["answer"] == f"a{NUL}b" and math.isnan(e.extra["extra_info"]["score"])
               for e in taken)
    batch = batch_from_experiences(taken, tokenizer.pad_token_id, response_length=3)
    assert batch.batch["responses"][:, 0].tolist() == [nul] * ROWS
    assert batch.batch["rollout_log_probs"][0, 0] == -math.inf
    rewards = batch.batch["token_level_scores"][:, 2]
    assert math.isnan(rewards[0]) and rewards[1:].tolist() == [1.0, 2.0, 3.0]
    buffer.close()


def _nul_sampling_model(folder, nul):
    """The tiny model with the NUL token sampled ~30% of the time: a large constant bias on the last
    MLP's output makes the final hidden state nearly the same at every position, and the NUL row of the
    output layer points along it (0.065 per unit: p(NUL) 0.06 at 0.05, 0.70 at 0.08)."""
    from transformers import AutoModelForCausalLM

    from hybrid_rl.utils.testing import build_tiny_model_dir

    build_tiny_model_dir(folder, mlp_bias=True)
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.bias.fill_(50.0)
        model.lm_head.weight[nul] = 0.065
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_an_async_run_whose_policy_samples_nul_completes(database, tmp_path):
    from tests.trainer.test_e2e import _assert_ok, _rows, _run_cli
    from tests.trainer.test_e2e_async import _async_args, _reward_args

    nul = nul_id(build_byte_tokenizer())
    model = _nul_sampling_model(tmp_path / "model", nul)
    result = _run_cli(tmp_path, model, *_reward_args(tmp_path), *_async_args(
        "async_training.max_head_offpolicyness=0", "async_training.buffer.storage_type=sql"),
        f"async_training.buffer.path='{database}'", "async_training.buffer.name=nul_run",
        "trainer.total_training_steps=2", "trainer.save_freq=-1")
    _assert_ok(result)
    logged = _rows(tmp_path / "run")
    assert [r["training/global_step"] for r in logged] == [1, 2]
    assert all(math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/grad_norm"]) for r in logged)
    buffer = SQLBuffer(database, "nul_run")
    trained = buffer.read("taken")
    buffer.close()
    with_nul = [e for e in trained if nul in e.response_ids]
    assert len(trained) == 16 and with_nul  # 2 steps x 8 rows, NUL sampled in some
    assert all(NUL in e.response_text for e in with_nul)
