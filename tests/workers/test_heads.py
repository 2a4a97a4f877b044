"""Heads (workers/heads.py) choose the learner's forward: the score head with the bradley_terry objective on
interleaved pair rows (dynamic micro-batches, shuffled mini-batches), scores in row order whatever the
forward's order, and an objective asking for what a head does not compute."""

import copy

import pytest
import torch
import torch.nn.functional as F

from hybrid_rl.data.reward_data import pair_tensors
from hybrid_rl.objectives import ForwardNeeds, Objective
from hybrid_rl.objectives.preference import BradleyTerryObjective
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.forward import sequence_scores
from hybrid_rl.workers.heads import ScoreHead
from hybrid_rl.workers.learner import Learner
from hybrid_rl.workers.model_loader import load_value_model
from hybrid_rl.workers.reward_model import interleave_pairs

PAD = 0


@pytest.fixture(scope="module")
def rm_module(tiny_model_dir):
    torch.manual_seed(0)
    return load_value_model(tiny_model_dir, override_config={"token_classification_bias": False})


def _sequences(num: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (int(n),), generator=g).tolist() for n in torch.randint(3, 12, (num,), generator=g)]


def _pairs(num: int = 8) -> DataProto:
    margins = [0.25 * i for i in range(num)]
    return DataProto.from_dict(pair_tensors(_sequences(num, 1), _sequences(num, 2), PAD, margins),
                               meta_info={"global_steps": 1})


class _Spy(BradleyTerryObjective):
    """Bradley-Terry, recording each micro-batch's row count."""

    rows: list[int] = []

    def __call__(self, mb):
        self.rows.append(mb.scores.shape[0])
        return super().__call__(mb)


def _learner(module, **kw) -> Learner:
    return Learner(module, torch.optim.SGD(module.parameters(), lr=0.0), head=ScoreHead(), attn_key=None,
                   role="reward_model", **kw)


def test_bradley_terry_on_interleaved_pairs_with_dynamic_batches_and_shuffle(rm_module):
    pairs = _pairs()
    with torch.no_grad():  # the expected loss: each side scored on its own
        side = {s: sequence_scores(rm_module, pairs.batch[f"{s}_input_ids"], pairs.batch[f"{s}_attention_mask"],
                                   pairs.batch[f"{s}_position_ids"], False) for s in ("chosen", "rejected")}
    expected = -F.logsigmoid(side["chosen"] - side["rejected"] - pairs.batch["margin"])  # [8] per pair
    model = copy.deepcopy(rm_module)
    learner = _learner(model, mini_batch_rows=8, use_dynamic_bsz=True, max_token_len=30)
    spy = _Spy()
    spy.rows = []
    metrics = learner.update(interleave_pairs(pairs, PAD), spy, shuffle=True, metric_prefix="rm")
    # lr 0: both mini-batches (4 shuffled pairs each) see the same scores; their means average to the batch's
    assert len(metrics["rm/loss"]) == 2
    assert sum(metrics["rm/loss"]) / 2 == pytest.approx(expected.mean().item(), rel=1e-5)
    assert len(spy.rows) > 2 and all(n % 2 == 0 for n in spy.rows) and sum(spy.rows) == 16
    assert set(metrics) == {"rm/loss", "rm/accuracy", "rm/margin", "rm/chosen_mean", "rm/rejected_mean",
                            "rm/padding_frac", "rm/grad_norm", "rm/num_skipped_steps"}


def test_paired_forward_order_gives_the_row_order_scores(rm_module):
    rows = interleave_pairs(_pairs(), PAD)
    learner = Learner(rm_module, mini_batch_rows=16, micro_batch_rows=6, head=ScoreHead(), attn_key=None)
    paired = learner.compute_scores(rows, paired=True)
    single = learner.compute_scores(rows, micro_batch_rows=5)
    assert paired.shape == (16,)
    torch.testing.assert_close(paired, single, rtol=1e-4, atol=1e-5)


class _NeedsEntropy(Objective):
    reads = ()

    @property
    def forward(self) -> ForwardNeeds:
        return ForwardNeeds(entropy=True)


def test_an_objective_needing_what_the_head_lacks_is_refused(rm_module):
    learner = _learner(copy.deepcopy(rm_module), mini_batch_rows=16, micro_batch_rows=16)
    with pytest.raises(ValueError, match=r"^the _NeedsEntropy objective needs entropies or top-K log-probs, which "
                                         r"the score head does not compute. Fix: train that objective with the "
                                         r"log-prob head \(the actor\).$"):
        learner.update(interleave_pairs(_pairs(), PAD), _NeedsEntropy())
