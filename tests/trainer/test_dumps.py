"""trainer.rollout_data_dir / validation_data_dir: veRL's per-step JSONL and our sidecar, row by row.

The driver runs with in-process fake workers (trainer_fakes.py); the batches the fake actor trains on
are kept, and every dumped row is compared with its batch row.
"""

import gzip
import json
import os
import stat

import pytest
import torch

from hybrid_rl.agents import BaseInteraction, register_interaction
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.loader import get_config
from hybrid_rl.trainer.core.dumps import DumpPart, StepDumps, sidecar_rows
from hybrid_rl.trainer.core.worker_groups import WorkerGroups
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer

from test_driver_loop import _overrides
from trainer_fakes import FakeActorRollout, FakePool

VERL_KEYS = ["input", "output", "gts", "score", "step"]
SCORER = ("def parts(data_source, solution_str, ground_truth, extra_info=None):\n"
          "    return {'score': float(len(solution_str) % 3), 'acc': float(len(solution_str) % 2)}\n")


class RecordingActor(FakeActorRollout):
    """The fake actor, keeping every batch it is asked to train on."""

    def __init__(self):
        super().__init__()
        self.trained: list[DataProto] = []

    def update_actor(self, data: DataProto) -> DataProto:
        self.trained.append(data)
        return super().update_actor(data)


class ToolTurnActor(RecordingActor):
    """Responses of three turns: model tokens, a 3-token observation (response_mask 0, attended), model."""

    def __init__(self, observation: list[int]):
        super().__init__()
        self.observation = observation

    def generate_sequences(self, gen: DataProto) -> DataProto:
        out = super().generate_sequences(gen)
        b = len(out)
        responses = torch.tensor([[51, 52, *self.observation, 53, 2, 0]] * b)  # model, observation, model, eos, pad
        attention = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]] * b)
        mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0]] * b)
        prompts = out.batch["prompts"]
        out.batch = DataProto.from_dict(tensors={
            "prompts": prompts, "responses": responses, "response_mask": mask,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": torch.cat([gen.batch["attention_mask"], attention], 1),
            "position_ids": torch.cat([gen.batch["position_ids"], gen.batch["position_ids"][:, -1:] + 1 +
                                       torch.arange(8)], 1)}).batch
        out.non_tensor_batch["num_turns"] = torch.full((b,), 4).numpy().astype(object)
        return out


def _run(tmp_path, model_dir, actor, *extra):
    overrides = _overrides(tmp_path, model_dir, "trainer.total_training_steps=2", "trainer.save_freq=-1",
                           f"trainer.rollout_data_dir={tmp_path}/rollouts",
                           f"trainer.validation_data_dir={tmp_path}/val", *extra)
    trainer = RayPPOTrainer(get_config(overrides))
    trainer.workers = WorkerGroups(actor, None, FakePool())
    trainer.fit()
    return trainer


def _lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_two_steps_write_verls_layout_and_an_aligned_sidecar(tmp_path, tiny_model_dir):
    scorer = tmp_path / "parts.py"
    scorer.write_text(SCORER)
    actor = RecordingActor()
    trainer = _run(tmp_path, tiny_model_dir, actor, f"custom_reward_function.path={scorer}",
                   "custom_reward_function.name=parts", "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    rollouts, val = str(tmp_path / "rollouts"), str(tmp_path / "val")
    assert sorted(os.listdir(rollouts)) == ["1.jsonl", "1.sidecar.jsonl", "2.jsonl", "2.sidecar.jsonl"]
    assert sorted(os.listdir(val)) == ["0.jsonl", "0.sidecar.jsonl", "2.jsonl", "2.sidecar.jsonl"]
    for name in os.listdir(rollouts):
        assert stat.S_IMODE(os.stat(os.path.join(rollouts, name)).st_mode) == 0o600
    tok = trainer.tokenizer
    for step, batch in enumerate(actor.trained, start=1):
        verl = _lines(os.path.join(rollouts, f"{step}.jsonl"))
        side = _lines(os.path.join(rollouts, f"{step}.sidecar.jsonl"))
        assert len(verl) == len(side) == len(batch) == 8  # 4 prompts x n=2
        width = batch.batch["prompts"].shape[-1]
        for i, (line, extra) in enumerate(zip(verl, side)):
            assert list(line) == VERL_KEYS + ["acc"]  # veRL's keys in veRL's order, then the scorer's
            assert line["step"] == step and extra["step"] == step and extra["row"] == i
            assert line["score"] == pytest.approx(float(batch.batch["token_level_scores"][i].sum()))
            assert line["acc"] == batch.non_tensor_batch["reward_extra_acc"][i]
            assert line["gts"] == batch.non_tensor_batch["reward_model"][i]["ground_truth"]
            prompt_mask = batch.batch["attention_mask"][i, :width].bool()
            assert line["input"] == tok.decode(batch.batch["prompts"][i][prompt_mask].tolist(), skip_special_tokens=True)
            valid = int(batch.batch["attention_mask"][i, width:].sum())
            assert extra["prompt_ids"] == batch.batch["prompts"][i][prompt_mask].tolist()
            assert extra["response_ids"] == batch.batch["responses"][i, :valid].tolist()
            assert line["output"] == tok.decode(extra["response_ids"], skip_special_tokens=True)
            for key in ("response_mask", "advantages", "old_log_probs"):
                assert len(extra[key]) == valid, key
            assert extra["advantages"] == batch.batch["advantages"][i, :valid].tolist()
            assert extra["old_log_probs"] == batch.batch["old_log_probs"][i, :valid].tolist()
            assert extra["uid"] == batch.non_tensor_batch["uid"][i] and extra["policy_version"] == step - 1
            assert extra["turns"] == [{"start": 0, "end": valid, "mask": 1}]
    # GRPO: a group's advantages (one value per row) sum to zero, as the dump shows them
    side = _lines(os.path.join(rollouts, "1.sidecar.jsonl"))
    for a, b in zip(side[::2], side[1::2]):
        assert a["uid"] == b["uid"] and a["advantages"][0] + b["advantages"][0] == pytest.approx(0.0, abs=1e-5)
    held_out = _lines(os.path.join(val, "2.jsonl"))
    assert len(held_out) == 6 and list(held_out[0])[:6] == VERL_KEYS + ["reward"]
    assert all(r["reward"] == r["score"] and r["step"] == 2 for r in held_out)
    metrics = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert "timing_s/dump_rollout" in metrics[1] and "timing_s/dump_rollout" in metrics[2]


def test_multi_turn_rows_show_observation_turns_with_mask_zero(tmp_path, tiny_model_dir):
    tok = _tokenizer(tmp_path, tiny_model_dir)
    actor = ToolTurnActor(tok.encode("OK!", add_special_tokens=False))
    assert len(actor.observation) == 3
    trainer = _run(tmp_path, tiny_model_dir, actor, "trainer.val_before_train=false", "trainer.val_at_end=false",
                   "trainer.total_training_steps=1")
    side = _lines(str(tmp_path / "rollouts" / "1.sidecar.jsonl"))
    verl = _lines(str(tmp_path / "rollouts" / "1.jsonl"))
    observation = "OK!"
    for line, extra in zip(verl, side):
        assert extra["response_mask"] == [1, 1, 0, 0, 0, 1, 1] and extra["num_turns"] == 4
        assert [(t["start"], t["end"], t["mask"]) for t in extra["turns"]] == [(0, 2, 1), (2, 5, 0), (5, 7, 1)]
        assert extra["turns"][1]["text"] == observation
        assert observation in line["output"]  # veRL's output is every real token, observations included


def _batch(rows: int) -> DataProto:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(51, 61, (rows, 3), generator=g)
    responses = torch.randint(51, 61, (rows, 4), generator=g)
    attention = torch.ones(rows, 7, dtype=torch.long)
    attention[:, 6] = 0  # the last response token is padding
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attention,
                 "response_mask": attention[:, 3:].clone(), "advantages": torch.randn(rows, 4, generator=g)},
        non_tensors={"uid": [f"u{i // 2}" for i in range(rows)]})


def _tokenizer(tmp_path, model_dir):
    from hybrid_rl.trainer.ppo.inputs import build_tokenizer

    return build_tokenizer(get_config(_overrides(tmp_path, model_dir)))


def test_row_bound_and_gzip(tmp_path, tiny_model_dir):
    tok = _tokenizer(tmp_path, tiny_model_dir)
    dumps = StepDumps(str(tmp_path / "d"), tok, max_rows=5, compress=True)
    parts = [DumpPart(_batch(4), [1.0, 0.0, 1.0, 0.0], {"acc": [1, 0, 1, 0], "short": [1]}), DumpPart(_batch(4), [0.5] * 4, {})]
    verl_path, side_path = dumps.write(7, parts)
    assert (verl_path, side_path) == (str(tmp_path / "d" / "7.jsonl.gz"), str(tmp_path / "d" / "7.sidecar.jsonl.gz"))
    verl, side = _lines(verl_path), _lines(side_path)
    assert [r["score"] for r in verl] == [1.0, 0.0, 1.0, 0.0, 0.5]  # first 5 rows, in order, over both parts
    assert "short" not in verl[0] and verl[0]["acc"] == 1 and "acc" not in verl[4]  # a column not B long is left out
    assert [r["row"] for r in side] == [0, 1, 2, 3, 4] and all(len(r["response_ids"]) == 3 for r in side)
    assert side[4]["advantages"] == parts[1].batch.batch["advantages"][0, :3].tolist()
    plain = StepDumps(str(tmp_path / "p"), tok).write(7, parts)
    assert len(_lines(plain[0])) == 8 and os.path.getsize(plain[1]) > 2 * os.path.getsize(side_path) * 8 / 5


def test_sidecar_without_tokenizer_keeps_turn_runs():
    batch = _batch(2)
    batch.batch["response_mask"][0] = torch.tensor([1, 0, 1, 0])
    rows = sidecar_rows(batch, step=3, rows=2)
    assert rows[0]["turns"] == [{"start": 0, "end": 1, "mask": 1}, {"start": 1, "end": 2, "mask": 0},
                                {"start": 2, "end": 3, "mask": 1}]
    assert rows[1]["turns"] == [{"start": 0, "end": 3, "mask": 1}] and rows[1]["policy_version"] == 2


@pytest.mark.parametrize("key", ["rollout_data_dir", "validation_data_dir"])
def test_a_dump_folder_that_cannot_be_written_stops_at_start(tmp_path, tiny_model_dir, key):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cfg = get_config(_overrides(tmp_path, tiny_model_dir, f"trainer.{key}={blocker}/dumps"))
    with pytest.raises(ValueError) as error:
        RayPPOTrainer(cfg)
    assert str(error.value) == (f"trainer.{key}='{blocker}/dumps' cannot hold the dumps: {blocker} is a file, not a "
                                f"folder. Fix: point trainer.{key} at a folder you can write (it is created if "
                                f"missing), or set it to null (no dump).")
    empty = get_config(_overrides(tmp_path, tiny_model_dir, f"trainer.{key}=''"))
    with pytest.raises(ValueError, match=rf"^trainer.{key}='' cannot hold the dumps: it is empty\. Fix:"):
        RayPPOTrainer(empty)


def test_row_bound_below_one_is_refused(tmp_path, tiny_model_dir):
    cfg = get_config(_overrides(tmp_path, tiny_model_dir, "trainer.dump_max_rows_per_step=0"))
    with pytest.raises(ValueError, match=r"trainer\.dump_max_rows_per_step=0 is invalid: must be >= 1 or null\. "
                                         r"Fix: use e\.g\. 64, or null \(every row\)\."):
        RayPPOTrainer(cfg)


@register_interaction("test_dumps_go_on_twice")
class GoOnTwice(BaseInteraction):
    """Answers the model "go on" twice, then ends the trajectory (tests/rollout/test_multi_turn_engines.py's)."""

    async def generate_response(self, instance_id, messages, **kwargs):
        turns = sum(m["role"] == "assistant" for m in messages)
        return turns >= 3, "go on", float(turns), {}


def test_a_real_multi_turn_rollout_dumps_its_observations_with_mask_zero(tmp_path, tiny_model_dir):
    """The hf engine's multi-turn loop (every token an EOS: each model turn is one token) with an
    interaction that answers twice: the sidecar's turns are model 1 / observation 0 / 1 / 0 / 1, the
    observations decode to the encoded reply, and the rollout log-probs are 0 on them."""
    from hybrid_rl.agents.chat import ObservationEncoder
    from hybrid_rl.workers.model_loader import load_tokenizer
    from hybrid_rl.workers.rollout import RolloutConfig, build_rollout

    config = tmp_path / "interactions.yaml"
    config.write_text("interaction:\n  - name: go\n    class_name: test_dumps_go_on_twice\n")
    tok = load_tokenizer(tiny_model_dir)
    engine = build_rollout(RolloutConfig(name="hf", dtype="float32", response_length=64, prompt_length=8,
                                         calculate_log_probs=True, seed=0,
                                         multi_turn={"enable": True, "interaction_config_path": str(config)}),
                           tiny_model_dir, tok, "cpu")
    prompts = DataProto.from_dict(
        {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
         "position_ids": torch.arange(3)[None]},
        non_tensors={"extra_info": [{"interaction_kwargs": {"name": "go"}}],
                     "raw_prompt": [[{"role": "user", "content": "q"}]]},
        meta_info={"eos_token_id": list(range(320)), "pad_token_id": 0, "do_sample": False, "global_steps": 1})
    try:
        out = engine.generate_sequences(prompts)
    finally:
        engine.shutdown()
    verl_path, side_path = StepDumps(str(tmp_path / "d"), tok).write(1, [DumpPart(out, [1.0], {})])
    (row,), (line,) = _lines(side_path), _lines(verl_path)
    reply = ObservationEncoder(tok, "<|im_end|>").encode([{"role": "user", "content": "go on"}])
    k = len(reply)
    assert [(t["start"], t["end"], t["mask"]) for t in row["turns"]] == [
        (0, 1, 1), (1, 1 + k, 0), (1 + k, 2 + k, 1), (2 + k, 2 + 2 * k, 0), (2 + 2 * k, 3 + 2 * k, 1)]
    assert row["turns"][1]["text"] == row["turns"][3]["text"] == tok.decode(reply)
    assert row["rollout_log_probs"][1:1 + k] == [0.0] * k and row["rollout_log_probs"][0] < 0
    assert row["num_turns"] == 6 and row["turn_scores"] == [1.0, 2.0, 3.0]
    assert row["agent_metrics"]["ended_by/interaction"] == 1.0
    assert line["output"] == tok.decode(row["response_ids"], skip_special_tokens=True)


def test_the_decoupled_mode_dumps_its_buffer_rows_with_their_policy_version(tmp_path, tiny_model_dir):
    """The decoupled plan keeps dump_rollout (after the update, before the weight sync), and a batch
    taken from the experience buffer dumps each row's own policy version."""
    from hybrid_rl.algorithms.rollout_correction import resolve_preset
    from hybrid_rl.buffer import MemoryBuffer
    from hybrid_rl.trainer.config.checks import make_run_plan
    from hybrid_rl.trainer.config.loader import to_ppo_config
    from hybrid_rl.trainer.ppo.contracts import decoupled_batch_plan, ppo_batch_plan

    from test_take_experiences import _group, _trainer as buffer_trainer

    cfg = to_ppo_config(get_config(_overrides(tmp_path, tiny_model_dir, f"trainer.rollout_data_dir={tmp_path}/r")))
    plan = decoupled_batch_plan(ppo_batch_plan(cfg, make_run_plan(cfg), resolve_preset(cfg.algorithm.rollout_correction)), cfg)
    plan.check()
    names = [s.name for s in plan.steps]
    assert names[-3:] == ["update_actor", "dump_rollout", "sync_rollout_weights"]
    buffer = MemoryBuffer()
    buffer.put(_group(5, "a") + _group(6, "b"))
    batch = buffer_trainer(buffer).take_experiences(None, {})
    rows = sidecar_rows(batch, step=7, rows=len(batch))
    assert [r["policy_version"] for r in rows] == [int(v) for v in batch.non_tensor_batch["policy_version"]]
    assert sorted(r["policy_version"] for r in rows) == [5, 5, 6, 6]
