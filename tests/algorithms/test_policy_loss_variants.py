"""veRL's other policy losses: values and gradients against formulas written out from veRL's
core_algos.py (random inputs), hand-computed cases, split invariance, the IS weights, the registry."""

import pytest
import torch

from hybrid_rl.algorithms import describe_policy_losses, get_policy_loss_fn
from split_invariance import assert_split_invariant, partitions

F64 = torch.float64
B, R = 6, 7


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, R, generator=gen, dtype=F64) * 2 - 0.05
    log_prob = (old + torch.randn(B, R, generator=gen, dtype=F64) * 0.3).clamp(max=-1e-3)
    adv = torch.randn(B, R, generator=gen, dtype=F64)
    mask = (torch.rand(B, R, generator=gen) > 0.25).to(F64)
    mask[:, 0] = 1
    return old, log_prob, adv, mask


def _token_mean(loss, mask):
    return (loss * mask).sum() / mask.sum()


def _seq_mean_token_mean(loss, mask):
    return ((loss * mask).sum(-1) / mask.sum(-1)).mean()


# veRL's formulas (verl/trainer/ppo/core_algos.py, 2026-08), written out plainly
def ref_gpg(old, lp, adv, mask):
    return _token_mean(-lp * adv, mask)


def ref_cispo(old, lp, adv, mask, low=0.2, high=0.28):
    r = torch.exp((lp - old).clamp(-20, 20))
    return _token_mean(-torch.clamp(r, 1 - low, 1 + high).detach() * adv * lp, mask)


def ref_sapo(old, lp, adv, mask, tau_pos=1.0, tau_neg=1.05):
    r = torch.exp((lp - old).clamp(-20, 20))
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    return _seq_mean_token_mean(-(torch.sigmoid(tau * (r - 1)) * 4 / tau) * adv, mask)


def ref_dro(old, lp, adv, mask, beta=0.1):
    return _token_mean(-(lp * adv - 0.5 * beta * (lp - old) ** 2), mask)


def ref_dppo(old, lp, adv, mask, kind, low=0.2, high=0.28, c=3.0):
    r = torch.exp((lp - old).clamp(-20, 20))
    p, p_old = lp.exp(), old.exp()
    if kind == "tv":
        pos, neg = (p - p_old) <= high, (p - p_old) >= -low
    else:
        bkl = p_old * (old - lp) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        pos, neg = (bkl <= high) | (p <= p_old), (bkl <= low) | (p >= p_old)
    valid = torch.where(adv > 0, pos, neg).detach().to(F64)
    return _token_mean(-adv * torch.clamp(r, max=c).detach() * lp * valid, mask)


def ref_kl_cov(old, lp, adv, mask, ratio=0.2, coef=0.1):
    x = lp - old
    losses = (-adv * x.exp()).clone()
    penalised = -adv * x.exp() + coef * x.abs()
    idx = torch.nonzero(mask.reshape(-1) > 0).squeeze(-1)
    a, l = adv.reshape(-1)[idx].detach(), lp.reshape(-1)[idx].detach()
    cov = (a - a.mean()) * (l - l.mean())
    sel = idx[torch.topk(cov, max(1, int(len(idx) * ratio))).indices]
    losses.reshape(-1)[sel] = penalised.reshape(-1)[sel]
    return _token_mean(losses, mask)


def ref_clip_cov(old, lp, adv, mask, ratio=0.2, lb=-1.0, ub=5.0, low=0.2, high=0.28):
    r = (lp - old).exp()
    pg1, pg2 = -adv * r, -adv * torch.clamp(r, 1 - low, 1 + high)
    m = mask > 0
    cov = (adv - adv[m].mean()) * (lp - lp.detach()[m].mean())
    cov = cov.masked_fill(~m | (pg2 > pg1), -float("inf"))
    cand = torch.nonzero((cov < ub) & (cov > lb) & m)
    corr = torch.ones_like(adv)
    if len(cand):
        cand = cand[torch.randperm(len(cand))[:max(int(ratio * m.sum().item()), 1)]]
        corr[cand[:, 0], cand[:, 1]] = 0
    return _token_mean(torch.maximum(pg1, pg2) * corr, mask)


def ref_geo_mean(old, lp, adv, mask, low=0.2, high=0.28):
    x = lp - old
    s = torch.sign(adv)
    xm = s * torch.minimum(s * x, s * torch.clamp(x, -low, high))
    n = mask.sum(-1)
    ratio = torch.exp((xm * mask).sum(-1) / (n + 1e-8))
    return (-(adv * mask).sum(-1) / (n + 1e-8) * ratio).mean()


CASES = {
    "gpg": (ref_gpg, {}), "cispo": (ref_cispo, {}), "sapo": (ref_sapo, {}), "dro": (ref_dro, {"dro_beta": 0.1}),
    "dppo_tv": (lambda *a: ref_dppo(*a, "tv"), {}), "dppo_kl": (lambda *a: ref_dppo(*a, "kl"), {}),
    "kl_cov": (ref_kl_cov, {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.1}),
    "clip_cov": (ref_clip_cov, {"clip_cov_ratio": 0.2, "clip_cov_lb": -1.0, "clip_cov_ub": 5.0}),
    "geo_mean": (ref_geo_mean, {}),
}


def _ours(name, old, lp, adv, mask, **kw):
    settings = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05, **kw)
    return get_policy_loss_fn(name)(old, lp, adv, mask, **{**settings, **CASES[name][1]})


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_verls_formulas(name):
    for seed in range(3):
        old, base, adv, mask = _inputs(seed)
        lp_ours, lp_ref = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
        torch.manual_seed(seed)  # clip_cov draws its tokens from torch's global RNG, as veRL
        ours = _ours(name, old, lp_ours, adv, mask)[0]
        torch.manual_seed(seed)
        ref = CASES[name][0](old, lp_ref, adv, mask)
        ours.backward()
        ref.backward()
        assert ours.item() == pytest.approx(ref.item(), rel=1e-9, abs=1e-12), name
        assert torch.allclose(lp_ours.grad, lp_ref.grad, atol=1e-12, rtol=1e-9), name


def test_hand_computed_cispo_and_gpg():
    old = torch.zeros(1, 2, dtype=F64)
    lp = torch.log(torch.tensor([[1.5, 0.9]], dtype=F64)).requires_grad_(True)  # ratios 1.5 (clipped to 1.28), 0.9
    adv = torch.tensor([[2.0, -1.0]], dtype=F64)
    loss, clipfrac, _, _ = _ours("cispo", old, lp, adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx((-1.28 * 2 * lp[0, 0].item() + 0.9 * lp[0, 1].item()) / 2)
    assert clipfrac.item() == 0.5
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.28 * 2 / 2, 0.9 / 2])  # every token keeps its gradient
    lp.grad = None
    _ours("gpg", old, lp, adv, torch.ones(1, 2))[0].backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.0, 0.5])


@pytest.mark.parametrize("name", ["gpg", "cispo", "sapo", "dro", "dppo_tv", "dppo_kl", "geo_mean"])
def test_split_invariance(name):
    old, base, adv, mask = _inputs(4)
    param = base.clone().requires_grad_(True)

    def loss_fn(rows, dens):
        return _ours(name, old[rows], param[rows], adv[rows], mask[rows], **dens)[0]

    for layout in partitions(B):
        assert_split_invariant(loss_fn, param, mask, layout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_unit_is_weights_change_nothing_and_others_do(name):
    old, lp, adv, mask = _inputs(5)
    torch.manual_seed(0)
    plain = _ours(name, old, lp, adv, mask)[0]
    torch.manual_seed(0)
    ones = _ours(name, old, lp, adv, mask, rollout_is_weights=torch.ones_like(lp))[0]
    torch.manual_seed(0)
    halves = _ours(name, old, lp, adv, mask, rollout_is_weights=torch.full_like(lp, 0.5))[0]
    assert ones.item() == pytest.approx(plain.item(), rel=1e-9)  # geo_mean: exp(mean log(w + 1e-10)), as veRL
    assert halves.item() == pytest.approx(plain.item() / 2, rel=1e-6)  # a constant weight scales the loss
    assert describe_policy_losses()[name].applies_rollout_is_weights


def test_dro_requires_its_beta():
    assert describe_policy_losses()["dro"].requires == ("actor_rollout_ref.actor.policy_loss.dro_beta",)
    old, lp, adv, mask = _inputs(0)
    with pytest.raises(ValueError, match="dro_beta > 0"):
        get_policy_loss_fn("dro")(old, lp, adv, mask)


@pytest.mark.parametrize("name", sorted(CASES))
def test_multi_turn_holes_equal_the_single_turn_layout(name):
    """Observation tokens (mask 0 inside a response) change nothing: the loss and its gradient equal
    those of the same tokens laid out contiguously, as a single-turn response."""
    old, base, adv, _ = _inputs(6)
    holes = torch.ones(B, R, dtype=F64)
    holes[:, 2:4] = 0  # a tool observation in the middle of every response
    keep = holes[0].bool()
    compact = torch.zeros(B, R, dtype=F64)
    compact[:, :int(keep.sum())] = 1

    def packed(t):
        out = torch.zeros_like(t)
        out[:, :int(keep.sum())] = t[:, keep]
        return out

    results = []
    for layout, (o, a, m) in {"holes": (old, adv, holes), "compact": (packed(old), packed(adv), compact)}.items():
        lp = (base if layout == "holes" else packed(base)).clone().requires_grad_(True)
        torch.manual_seed(0)
        loss = _ours(name, o, lp, a, m)[0]
        loss.backward()
        grad = lp.grad if layout == "compact" else packed(lp.grad)
        results.append((loss.item(), grad))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-10, abs=1e-12)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-12)
