"""GRPO training end to end against independent references: sampling's tokens against greedy decoding (a
near-zero temperature) and its frequencies against the model's softmax, the old log-probabilities against each
sequence scored alone without a cache, the verifier on hand-written answers, one step against `grpo_loss` by
hand, and a killed run resumed bit for bit."""

from __future__ import annotations

import pytest
import torch
from killed_runs import Interrupted, dies_at_call

from gptcourse import (
    GPT,
    GPTConfig,
    GRPOBatch,
    GRPOConfig,
    addition_problems,
    addition_reward,
    frozen_copy,
    greedy_until_stop,
    group_advantages,
    grpo_loss,
    grpo_step,
    sample_groups,
    token_logprobs,
    train_grpo,
)

CONFIG = GPTConfig(vocab_size=13, context_length=16, d_model=32, n_heads=4, n_layers=2, mlp="gelu_tanh")
STOP = 0
PROMPTS = [[5, 9, 3], [4, 8], [7, 3, 1, 2], [6, 6]]


def _model() -> GPT:
    torch.manual_seed(0)
    model = GPT(CONFIG).eval()
    with torch.no_grad():  # larger than the init, so that the tokens' probabilities differ clearly
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _sample(model, group_size=3, max_new_tokens=5, temperature=1.0, seed=0):
    return sample_groups(model, PROMPTS, group_size, max_new_tokens, STOP, temperature,
                         generator=torch.Generator().manual_seed(seed))


def test_at_a_near_zero_temperature_every_answer_is_the_greedy_one():
    model = _model()
    greedy = greedy_until_stop(model, PROMPTS, STOP, max_new_tokens=6)
    groups = _sample(model, group_size=2, max_new_tokens=6, temperature=1e-4)
    assert groups.completions == [answer for answer in greedy for _ in range(2)]


def test_one_token_answers_come_as_often_as_the_softmax_says():
    model = _model()
    groups = sample_groups(model, [[5, 9, 3]], 6000, 1, STOP, generator=torch.Generator().manual_seed(1))
    counts = torch.bincount(torch.tensor([c[0] for c in groups.completions]), minlength=CONFIG.vocab_size)
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([[5, 9, 3]]))[0, -1].double(), -1)
    # binomial standard error at most sqrt(0.25 / 6000) = 0.0065: 4.5 of them
    assert torch.allclose(counts / 6000, probs.float(), atol=0.03)


def test_answers_end_at_the_stop_token_or_the_limit_and_the_mask_covers_them_alone():
    groups = _sample(_model(), group_size=4, max_new_tokens=5)
    rows = [p for p in PROMPTS for _ in range(4)]
    assert any(c[-1] == STOP for c in groups.completions) and any(len(c) == 5 for c in groups.completions)
    for row, (prompt, answer) in enumerate(zip(rows, groups.completions, strict=True)):
        assert (STOP not in answer[:-1]) and (answer[-1] == STOP or len(answer) == 5)
        n = len(prompt) + len(answer)
        assert groups.ids[row, :n].tolist() == prompt + answer and groups.attention_mask[row].sum() == n
        # position j predicts token j + 1: the answer's tokens are predicted from len(prompt) - 1 on
        assert groups.completion_mask[row].nonzero().flatten().tolist() == list(range(len(prompt) - 1, n - 1))


def test_old_logprobs_equal_each_sequence_scored_alone_without_a_cache():
    model = _model()
    groups = _sample(model, temperature=0.7)
    rows = [p for p in PROMPTS for _ in range(3)]
    for row, (prompt, answer) in enumerate(zip(rows, groups.completions, strict=True)):
        seq = prompt + answer
        for i, token in enumerate(answer):
            with torch.no_grad():
                logits = model(torch.tensor([seq[: len(prompt) + i]]))[0, -1].double()  # (V,)
            slow = torch.log_softmax(logits / 0.7, -1)[token].item()
            assert groups.old_logprobs[row, len(prompt) - 1 + i].item() == pytest.approx(slow, abs=1e-5)
    recomputed = token_logprobs(model, groups.ids, groups.attention_mask, temperature=0.7).detach()
    torch.testing.assert_close(recomputed * groups.completion_mask, groups.old_logprobs, atol=1e-5, rtol=0)


def test_sample_groups_refuses_bad_input():
    with pytest.raises(ValueError, match="temperature > 0"):
        _sample(_model(), temperature=0.0)
    with pytest.raises(ValueError, match="no room"):
        sample_groups(_model(), [list(range(1, 17))], 2, 3, STOP)


def test_the_verifier_scores_exact_sums_and_the_format():
    assert addition_reward("23+45=", "68\n") == 1.0
    assert addition_reward("23+45=", "67\n") == 0.1 and addition_reward("23+45=", "67\n", format_weight=0.0) == 0.0
    assert [addition_reward("23+45=", c) for c in ("68", "68\n\n", " 68\n", "6 8\n", "x\n", "")] == [0.0] * 6
    problems = addition_problems(50, seed=3, largest=99)
    assert all(str(eval(prompt[:-1])) == answer for prompt, answer in problems)  # a prompt holds digits and '+'
    assert problems == addition_problems(50, seed=3, largest=99) and problems != addition_problems(50, seed=4)
    with pytest.raises(ValueError, match="'a\\+b='"):
        addition_reward("what is 2+2?", "4\n")


def test_one_step_is_grpo_loss_by_hand_and_never_moves_the_reference():
    policy = _model()
    reference = frozen_copy(policy)
    with torch.no_grad():  # a reference that is not the policy
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    before = [p.clone() for p in reference.parameters()]
    groups = _sample(policy)
    advantages = group_advantages(torch.arange(12.0) % 5, 3)
    batch = GRPOBatch(groups.ids, groups.attention_mask, groups.completion_mask, groups.old_logprobs, advantages)
    twin = _model()
    lp = token_logprobs(twin, groups.ids, groups.attention_mask)
    with torch.no_grad():
        ref = token_logprobs(reference, groups.ids, groups.attention_mask)
    by_hand, _ = grpo_loss(lp, groups.old_logprobs, ref, advantages, groups.completion_mask, 0.2, 0.3)
    by_hand.backward()
    with torch.no_grad():
        for p in twin.parameters():
            p.sub_(0.5 * p.grad)
    loss, _ = grpo_step(policy, reference, torch.optim.SGD(policy.parameters(), lr=0.5), batch, 0.2, 0.3)
    assert loss.item() == pytest.approx(by_hand.item(), abs=1e-6)
    for p, q in zip(policy.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
    assert all(torch.equal(p, q) for p, q in zip(reference.parameters(), before, strict=True))
    with pytest.raises(ValueError, match="pass one"):
        grpo_step(policy, None, torch.optim.SGD(policy.parameters(), lr=0.5), batch, 0.2, 0.3)


def _first_token_verifier(prompt, answer) -> float:
    """A task the tiny model learns in a few steps: answer with token 7."""
    return float(answer[:1] == [7])


CFG = GRPOConfig(steps=8, prompts_per_step=4, group_size=6, max_new_tokens=3, stop_id=STOP, lr=3e-2, beta=0.1,
                 updates_per_batch=2)


def test_the_reward_rises_and_the_reference_stays():
    policy = _model()
    reference = frozen_copy(policy)
    history = train_grpo(policy, reference, PROMPTS, _first_token_verifier, CFG)
    assert history[-1]["reward"] - history[0]["reward"] > 0.5  # from about 1 in 13 to most answers
    assert history[-1]["clip_fraction"] > 0  # the second update on a batch moves the ratio past 1 +- 0.2
    assert all(torch.equal(p, q) for p, q in zip(reference.parameters(), _model().parameters(), strict=True))


def test_with_one_update_per_batch_the_ratio_is_one_and_nothing_is_clipped():
    """The old log-probabilities come from the cached sampling, the new ones from a padded forward pass: equal up
    to float rounding when the policy has not moved since it sampled."""
    policy = _model()
    history = train_grpo(policy, None, PROMPTS, _first_token_verifier,
                         GRPOConfig(steps=3, prompts_per_step=4, group_size=4, max_new_tokens=3, stop_id=STOP,
                                    beta=0.0))
    assert all(abs(h["ratio"] - 1) < 1e-5 and h["clip_fraction"] == 0 and h["kl"] == 0 for h in history)


def test_a_killed_and_resumed_run_is_bit_for_bit_the_run_in_one_go(tmp_path):
    whole = _model()
    history = train_grpo(whole, frozen_copy(whole), PROMPTS, _first_token_verifier, CFG)
    killed = _model()
    path = tmp_path / "grpo.pt"
    with pytest.raises(Interrupted):  # two reference calls a step: killed in step 6, after a save at step 4
        train_grpo(killed, dies_at_call(frozen_copy(killed), 11), PROMPTS, _first_token_verifier, CFG,
                   checkpoint=path, checkpoint_every=4)
    resumed = _model()
    resumed_history = train_grpo(resumed, frozen_copy(resumed), PROMPTS, _first_token_verifier, CFG,
                                 checkpoint=path, resume=path)
    assert resumed_history == history
    for (name, p), q in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    with pytest.raises(ValueError, match="other settings"):
        train_grpo(_model(), None, PROMPTS[:-1], _first_token_verifier, CFG, resume=path)
