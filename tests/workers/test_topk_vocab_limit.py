"""A teacher padded wider than the student picks its top-K among the student's ids, with log-probs
normalised over the teacher's whole vocabulary (``response_topk``'s ``vocab_limit``)."""

import math

import torch

from hybrid_rl.workers import topk_forward


def test_top_k_skips_padded_ids_and_keeps_the_true_mass(monkeypatch):
    # one response of two tokens; teacher width 5, student width 3: ids 3 and 4 are padding
    logits = torch.tensor([[0.0, 1.0, 2.0, 9.0, 3.0],    # padded ids 3, 4 lead: both must be passed over
                           [5.0, 0.0, 4.0, 0.0, 0.0]])  # [N=2, V=5]
    labels, index = torch.tensor([2, 0]), torch.tensor([0, 1])
    monkeypatch.setattr(topk_forward, "_response_logits", lambda *a, **k: (logits, labels, index))
    batch = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "responses": torch.zeros(1, 2, dtype=torch.long)}

    values, ids, sampled = topk_forward.response_topk(None, batch, 1.0, 2, False, vocab_limit=3)
    log_z = [math.log(sum(math.exp(v) for v in row)) for row in logits.tolist()]  # over all 5 logits
    assert ids.tolist() == [[[2, 1], [0, 2]]]
    expected = [[[2.0 - log_z[0], 1.0 - log_z[0]], [5.0 - log_z[1], 4.0 - log_z[1]]]]
    assert torch.allclose(values, torch.tensor(expected), atol=1e-6)
    assert torch.allclose(sampled, torch.tensor([[2.0 - log_z[0], 5.0 - log_z[1]]]), atol=1e-6)

    _, ids_all, _ = topk_forward.response_topk(None, batch, 1.0, 2, False)  # no limit: the padded ids win
    assert ids_all.tolist() == [[[3, 4], [0, 2]]]
