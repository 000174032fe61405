"""GRPO's pieces against independent references: the policy gradient's closed form and k3's exact expectation by
enumeration on a small categorical, a slow loop and TRL's `nanstd` for the group advantages, and TRL's
`GRPOTrainer._compute_loss` for the loss, called on a stand-in carrying only what it reads."""

import itertools
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from gptcourse import group_advantages, grpo_loss, kl_k3, policy_gradient_loss


@pytest.fixture(autouse=True)
def _float64():
    """Exact comparisons in float64; restored after each test so other test files keep float32."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _categorical(seed: int, k: int = 5) -> torch.Tensor:
    return torch.randn(k, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("baseline", [None, 0.0, 0.7])
def test_policy_gradient_equals_the_closed_form_by_enumeration(baseline):
    """Every action a as a one-token sequence, weighted by p(a): the loss's gradient is then the exact
    -grad E[R] = -sum_a p(a) (R(a) - b) grad log p(a), computed here from softmax's Jacobian by hand."""
    logits = _categorical(0).requires_grad_()
    rewards = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5])
    p = torch.softmax(logits, 0).detach()
    b = float((p * rewards).sum()) if baseline is None else baseline
    # exact: grad_z log p(a) = onehot(a) - p, so grad E[R] = sum_a p(a) (R(a) - b) (onehot(a) - p)
    exact = sum(p[a] * (rewards[a] - b) * (torch.eye(5)[a] - p) for a in range(5))
    # the loss over all actions, each reweighted by 5 p(a) so that its mean is the expectation
    logprobs = torch.log_softmax(logits, 0).unsqueeze(1) * (5 * p).unsqueeze(1)  # (5, 1)
    loss = policy_gradient_loss(logprobs, rewards, torch.ones(5, 1), baseline=b)
    (grad,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(grad, -exact, rtol=1e-10, atol=1e-12)


def test_policy_gradient_skips_padding_and_uses_the_batch_mean_as_default_baseline():
    logprobs = torch.tensor([[-1.0, -2.0, -50.0], [-0.5, -30.0, -40.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rewards = torch.tensor([1.0, 0.0])
    loss = policy_gradient_loss(logprobs, rewards, mask)
    # slow: mean of -(R_i - mean R) * sum of real tokens
    slow = -((1.0 - 0.5) * (-3.0) + (0.0 - 0.5) * (-0.5)) / 2
    assert loss.item() == pytest.approx(slow)
    loss.backward()
    assert (logprobs.grad[mask == 0] == 0).all()


@pytest.mark.parametrize("batch", [2, 3])
def test_the_batch_mean_baseline_shrinks_the_expected_gradient_by_b_minus_1_over_b(batch):
    """Over every batch of B draws from a 4-action policy, weighted by its probability: with the default baseline
    (the batch's own mean, which includes each sample) the estimate's mean is (B - 1) / B times the exact gradient."""
    logits, rewards = _categorical(3, 4).double(), torch.tensor([1.0, 0.0, 2.0, -1.0], dtype=torch.float64)
    p = torch.softmax(logits, 0)
    exact = sum(p[a] * rewards[a] * (torch.eye(4, dtype=torch.float64)[a] - p) for a in range(4))  # grad E[R]
    expected = torch.zeros(4, dtype=torch.float64)
    for actions in itertools.product(range(4), repeat=batch):
        z = logits.clone().requires_grad_()
        logprobs = torch.log_softmax(z, 0)[list(actions)].unsqueeze(1)  # (B, 1)
        loss = policy_gradient_loss(logprobs, rewards[list(actions)], torch.ones_like(logprobs))
        expected -= p[list(actions)].prod() * torch.autograd.grad(loss, z)[0]
    torch.testing.assert_close(expected, (batch - 1) / batch * exact, rtol=1e-10, atol=1e-12)


def _slow_advantages(rewards, group_size, scale, eps):
    out = []
    for start in range(0, len(rewards), group_size):
        group = [float(r) for r in rewards[start:start + group_size]]
        mean = sum(group) / len(group)
        var = sum((r - mean) ** 2 for r in group) / (len(group) - 1) if len(group) > 1 else 0.0
        out += [(r - mean) / (var ** 0.5 + eps) if scale else r - mean for r in group]
    return torch.tensor(out)


@pytest.mark.parametrize("group_size", [1, 2, 4])
@pytest.mark.parametrize("scale", [True, False])
def test_group_advantages_equal_a_slow_loop(group_size, scale):
    rewards = torch.randn(8, generator=torch.Generator().manual_seed(group_size))
    torch.testing.assert_close(group_advantages(rewards, group_size, scale=scale, eps=1e-4),
                               _slow_advantages(rewards, group_size, scale, 1e-4))


def test_group_advantages_equal_trls_formula_with_its_nanstd():
    """TRL computes the advantages inline in `_generate_and_score_completions` (scale_rewards='group'):
    (r - group mean) / (nanstd(group) + 1e-4); its `nanstd` is public."""
    nanstd = pytest.importorskip("trl.trainer.utils", reason="trl is not installed (pip install -e '.[dev]')").nanstd
    rewards = torch.randn(12, generator=torch.Generator().manual_seed(3))
    groups = rewards.view(-1, 4)
    theirs = (groups - groups.mean(1, keepdim=True)) / (nanstd(groups, dim=1).unsqueeze(1) + 1e-4)
    torch.testing.assert_close(group_advantages(rewards, 4), theirs.reshape(-1))


def test_an_all_equal_group_gets_zeros_not_nan():
    advantages = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0]), 3)
    assert torch.equal(advantages[:3], torch.zeros(3))
    assert advantages[3:].abs().min() > 0.5


def test_group_advantages_refuse_a_batch_that_is_not_whole_groups():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.zeros(5), 2)


def test_k3_is_nonnegative_and_zero_only_where_the_two_agree():
    logp, ref = torch.randn(1000), torch.randn(1000)
    assert (kl_k3(logp, ref) >= 0).all()
    assert torch.equal(kl_k3(logp, logp), torch.zeros(1000))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k3_is_unbiased_for_kl_policy_to_reference_by_enumeration(seed):
    policy, ref = torch.log_softmax(_categorical(seed), 0), torch.log_softmax(_categorical(seed + 10), 0)
    expected_k3 = (policy.exp() * kl_k3(policy, ref)).sum()  # E over a ~ policy, exactly
    exact = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=policy),
                                              torch.distributions.Categorical(logits=ref))
    torch.testing.assert_close(expected_k3, exact)
    reverse = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=ref),
                                                torch.distributions.Categorical(logits=policy))
    assert abs(float(expected_k3 - reverse)) > 1e-3  # the direction matters, and this case tells them apart


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k3_as_a_loss_has_the_gradient_of_kl_reference_to_policy(seed):
    # unbiased for the value, not for the gradient: differentiated at the policy's samples (the sampling weights
    # held fixed), k3's expected gradient is that of KL(ref || policy) (Tang & Munos 2025)
    logits, ref = _categorical(seed).double(), torch.log_softmax(_categorical(seed + 10).double(), 0)

    def gradient(loss_of):
        z = logits.clone().requires_grad_()
        return torch.autograd.grad(loss_of(torch.log_softmax(z, 0)), z)[0]

    weights = torch.softmax(logits, 0)  # E over a ~ policy, exactly, not differentiated
    as_a_loss = gradient(lambda logp: (weights * kl_k3(logp, ref)).sum())
    dist = torch.distributions
    reverse = gradient(lambda logp: dist.kl_divergence(dist.Categorical(logits=ref), dist.Categorical(logits=logp)))
    forward = gradient(lambda logp: dist.kl_divergence(dist.Categorical(logits=logp), dist.Categorical(logits=ref)))
    torch.testing.assert_close(as_a_loss, reverse)
    assert (as_a_loss - forward).abs().max() > 1e-3


def _trl_grpo(logprobs, old, ref, advantages, mask, eps, beta, loss_type, max_len):
    """TRL's `_compute_loss` on a stand-in: the per-token log-probs are returned as if from the model."""
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer",
                                       reason="trl is not installed (pip install -e '.[dev]')")
    metrics = {"train": defaultdict(list)}
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logprobs, torch.zeros_like(logprobs), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=beta, loss_type=loss_type, epsilon_low=eps, epsilon_high=eps,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        use_vllm=False, vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=max_len, _entropy_bonus_enabled=False,
        accelerator=SimpleNamespace(num_processes=1, reduce=lambda x, reduction: x, gather=lambda x: x),
        _metrics=metrics)
    inputs = {"prompt_ids": torch.zeros(len(mask), 1, dtype=torch.long), "prompt_mask": torch.ones(len(mask), 1),
              "completion_ids": torch.zeros_like(mask, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum()}
    loss = grpo_trainer.GRPOTrainer._compute_loss(trainer, None, inputs)
    return loss, metrics["train"]


def _batch(seed, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logprobs = (old + 0.4 * torch.randn(B, T, generator=g)).requires_grad_()  # ratios both sides of 1 +- eps
    ref = old + 0.3 * torch.randn(B, T, generator=g)
    lengths = torch.tensor([7, 5, 3, 1, 6, 2])
    mask = (torch.arange(T) < lengths.unsqueeze(1)).double()  # (B, T): right padding
    advantages = torch.randn(B, generator=g)
    return logprobs, old, ref, advantages, mask


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize(("beta", "eps"), [(0.0, 0.2), (0.04, 0.2), (0.1, 0.1), (0.5, 0.3)])
def test_grpo_loss_equals_trls(loss_type, beta, eps):
    logprobs, old, ref, advantages, mask = _batch(int(beta * 100 + eps * 10))
    theirs, metrics = _trl_grpo(logprobs, old, ref, advantages, mask, eps, beta, loss_type, max_len=9)
    ours, stats = grpo_loss(logprobs, old, ref, advantages, mask, eps, beta, loss_type, max_completion_length=9)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    g_ours, = torch.autograd.grad(ours, logprobs)
    g_theirs, = torch.autograd.grad(theirs, logprobs)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-6)
    assert stats.clip_fraction == pytest.approx(metrics["clip_ratio/region_mean"][0], abs=1e-6)
    assert 0 < stats.clip_fraction < 1
    if beta:
        assert stats.kl == pytest.approx(metrics["kl"][0], abs=1e-6)
    ratio = torch.exp(logprobs - old).detach()
    assert stats.ratio == pytest.approx(float((ratio * mask).sum() / mask.sum()), abs=1e-12)


def test_padding_never_counts():
    logprobs, old, ref, advantages, mask = _batch(5)
    garbage = torch.where(mask.bool(), 0.0, 100.0)
    for loss_type in ["grpo", "bnpo", "dr_grpo", "dapo"]:
        clean, _ = grpo_loss(logprobs, old, ref, advantages, mask, 0.2, 0.1, loss_type, 9)
        noisy, _ = grpo_loss(logprobs + garbage, old - garbage, ref + garbage, advantages, mask, 0.2, 0.1,
                             loss_type, 9)
        torch.testing.assert_close(clean, noisy)


def test_grpo_loss_refuses_unknown_loss_types_and_dr_grpo_without_a_length():
    batch = _batch(0)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        grpo_loss(*batch, 0.2, 0.0, loss_type="ppo")
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(*batch, 0.2, 0.0, loss_type="dr_grpo")
