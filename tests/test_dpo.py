"""DPO (lesson 13): `sequence_logprobs` against a slow loop over each sequence run alone and against Hugging Face's
GPT2LMHeadModel(labels=...), on left and right padding; `dpo_loss` against TRL's DPOTrainer on the same
log-probabilities and its gradient against the closed form; the two references (a frozen copy, and a LoRA policy
with its adapters off); and the training loop's checkpoints."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from killed_runs import Interrupted, dies_at_call
from torch.nn import functional as F

from gptcourse import (
    GPT,
    IGNORE_INDEX,
    DPOConfig,
    GPTConfig,
    PreferencePair,
    adapters_disabled,
    add_lora,
    dpo_batch,
    dpo_loss,
    frozen_copy,
    pad_batch,
    response_labels,
    sequence_logprobs,
    train_dpo,
    without_adapters,
)

CONFIG = GPTConfig(vocab_size=41, context_length=24, d_model=32, n_heads=4, n_layers=2, mlp="gelu_tanh")
SEQUENCES = [[5, 9, 3, 7, 2], [4, 8, 1, 6, 6, 2, 9, 3, 11], [7, 3], [2, 2, 5, 8, 1, 9, 4]]
PROMPT_LENGTHS = [2, 4, 1, 6]  # the last response is one token long
BETAS = [0.01, 0.1, 0.5, 2.0]


def _model() -> GPT:
    torch.manual_seed(0)
    model = GPT(CONFIG).eval()
    with torch.no_grad():  # larger than the init, so that the log-probabilities differ clearly between tokens
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _batch(side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids, mask = pad_batch(SEQUENCES, pad_id=0, side=side)
    return ids, mask, response_labels(ids, torch.tensor(PROMPT_LENGTHS), mask)


def _slow_logprobs(model: GPT) -> torch.Tensor:
    """Each sequence alone, unpadded: log p(token t | tokens before t) added up over its response tokens."""
    totals = []
    for seq, prompt in zip(SEQUENCES, PROMPT_LENGTHS, strict=True):
        total = 0.0
        for t in range(prompt, len(seq)):
            logits = model(torch.tensor([seq[:t]]))[0, -1]  # (V,): the prediction of token t
            total += torch.log_softmax(logits.double(), dim=-1)[seq[t]].item()
        totals.append(total)
    return torch.tensor(totals)


@pytest.mark.parametrize("side", ["right", "left"])
def test_sequence_logprobs_equal_a_slow_loop_over_each_sequence_alone(side):
    model = _model()
    with torch.no_grad():
        ours = sequence_logprobs(model, *_batch(side))
    expected = _slow_logprobs(model)
    assert ours.shape == (len(SEQUENCES),)
    assert torch.allclose(ours.double(), expected.double(), atol=1e-4), (ours, expected)
    assert (expected < -1).all()  # far from 0: a missing or extra token would show


@pytest.mark.parametrize("side", ["right", "left"])
def test_sequence_logprobs_follow_hugging_faces_labels_convention(side):
    """GPT2LMHeadModel(labels=...) shifts the labels itself and averages over the labelled tokens: times their
    count, that is minus the summed log-probability of each row (each row run alone, so HF's positions agree)."""
    pytest.importorskip("transformers")
    model = _model()
    hf = model.to_hf().eval()
    ids, mask, labels = _batch(side)
    with torch.no_grad():
        ours = sequence_logprobs(model, ids, mask, labels)
        for b, row in enumerate(mask.bool()):
            counted = int((labels[b, row][1:] != IGNORE_INDEX).sum())
            hf_loss = hf(input_ids=ids[b, row][None], labels=labels[b, row][None]).loss
            assert abs(float(ours[b]) + counted * float(hf_loss)) <= 1e-4, (b, float(ours[b]), counted * hf_loss)


def test_sequence_logprobs_sum_not_average_and_skip_the_prompt():
    model = _model()
    ids, mask, labels = _batch("right")
    with torch.no_grad():
        summed = sequence_logprobs(model, ids, mask, labels)
        everything = sequence_logprobs(model, ids, mask, ids.masked_fill(mask == 0, IGNORE_INDEX))
    longer_prompts = [0, 1, 3]  # the prompt's tokens after the first add their log-probabilities, all negative
    assert (everything[longer_prompts] < summed[longer_prompts] - 0.5).all()
    assert everything[2] == summed[2]  # a prompt of one token: nothing comes before it to predict it from
    with pytest.raises(ValueError, match=r"one shape \(B, T\)"):
        sequence_logprobs(model, ids, mask, labels[:, 1:])


class _LogprobsAsModel:
    """A stand-in for TRL's model: its per-token log-probabilities put each sequence's whole sum on one token."""

    def __init__(self, logps: torch.Tensor, length: int) -> None:
        self.logps, self.length = logps, length

    def __call__(self, **kwargs: object) -> SimpleNamespace:
        per_token = F.pad(self.logps[:, None], (0, self.length - 2))  # (2B, T-1): the sum at t = 0, zeros after
        zeros = torch.zeros_like(per_token)
        return SimpleNamespace(log_probs=per_token, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())


def _trl_dpo(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    """TRL's DPOTrainer._compute_loss (sigmoid loss, reverse KL, reference log-probabilities precomputed) on these
    summed log-probabilities: its loss, and the mean implicit rewards and reward accuracy it logs."""
    dpo_trainer = pytest.importorskip("trl.trainer.dpo_trainer",
                                      reason="trl is not installed (pip install -e '.[dev]')")
    b, length = policy_chosen.numel(), 4
    accelerator = SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x)
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False,
        precompute_ref_logps=True, ld_alpha=None, f_divergence_type="reverse_kl", loss_types=["sigmoid"],
        loss_weights=[1.0], beta=beta, use_weighting=False, label_smoothing=0.0,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    ones = torch.ones(2 * b, length, dtype=torch.long)
    inputs = {"input_ids": ones, "attention_mask": ones, "completion_mask": ones,
              "ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}
    model = _LogprobsAsModel(torch.cat([policy_chosen, policy_rejected]), length)
    loss = dpo_trainer.DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    return loss, trainer._metrics["train"]


def _logps(b: int = 6, scale: float = 20.0, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [-(torch.rand(b, generator=gen, dtype=torch.float64) * scale) for _ in range(4)]


@pytest.mark.parametrize("beta", BETAS)
def test_dpo_loss_equals_trls(beta):
    logps = _logps()
    ours = dpo_loss(*logps, beta=beta)
    theirs, metrics = _trl_dpo(*logps, beta)
    assert abs(float(ours.loss) - float(theirs)) <= 1e-6
    assert abs(float(ours.chosen_rewards.mean()) - metrics["rewards/chosen"][0]) <= 1e-6
    assert abs(float(ours.rejected_rewards.mean()) - metrics["rewards/rejected"][0]) <= 1e-6
    assert abs(float(ours.accuracy) - metrics["rewards/accuracies"][0]) <= 1e-6
    assert 0.1 < float(ours.accuracy) < 0.9  # some pairs each way, so a swapped sign would show


@pytest.mark.parametrize("beta", BETAS)
def test_dpo_loss_gradient_is_the_closed_form(beta):
    """d loss / d log pi(y_w) = -beta sigmoid(-beta m) / B and the opposite for y_l, m the log-ratio margin;
    the reference gets no gradient."""
    policy_chosen, policy_rejected, ref_chosen, ref_rejected = _logps()
    policy_chosen.requires_grad_(True)
    policy_rejected.requires_grad_(True)
    ref_chosen.requires_grad_(True)
    dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta).loss.backward()
    with torch.no_grad():
        margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
        expected = -beta * torch.sigmoid(-beta * margin) / margin.numel()
    assert torch.allclose(policy_chosen.grad, expected, rtol=1e-9, atol=1e-12)
    assert torch.allclose(policy_rejected.grad, -expected, rtol=1e-9, atol=1e-12)
    assert ref_chosen.grad is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dpo_loss_is_stable_for_margins_of_a_thousand(dtype):
    zero = torch.zeros(2, dtype=dtype)
    policy_chosen = torch.tensor([1000.0, -1000.0], dtype=dtype, requires_grad=True)
    result = dpo_loss(policy_chosen, zero, zero, zero, beta=1.0)
    result.loss.backward()
    assert torch.isfinite(result.loss) and torch.isfinite(policy_chosen.grad).all()
    assert abs(result.loss.item() - 500.0) <= 1e-3  # (0 + 1000) / 2: -logsigmoid(-1000) = 1000
    assert torch.allclose(policy_chosen.grad, torch.tensor([0.0, -0.5], dtype=dtype))


def test_dpo_loss_refuses_bad_input():
    logps = _logps()
    with pytest.raises(ValueError, match="beta must be positive"):
        dpo_loss(*logps, beta=0.0)
    with pytest.raises(ValueError, match=r"shape \(B,\)"):
        dpo_loss(logps[0], logps[1][:3], logps[2], logps[3], beta=0.1)


def _lora_policy() -> GPT:
    policy = add_lora(_model(), rank=2, alpha=4, targets=("qkv", "fc_in"))
    with torch.no_grad():  # B starts at zero; trained adapters would not be
        for name, p in policy.named_parameters():
            if name.endswith(".B"):
                p.normal_(0, 0.2)
    return policy


def test_lora_reference_is_the_base_model_with_no_extra_parameters():
    base = _model()
    policy = _lora_policy()
    tensors_before = [(p.data_ptr(), p.numel()) for p in policy.parameters()]
    reference = without_adapters(policy)
    ids, mask, labels = _batch("left")
    with torch.no_grad():
        expected = sequence_logprobs(base, ids, mask, labels)
        with_adapters = sequence_logprobs(policy, ids, mask, labels)
    assert torch.allclose(sequence_logprobs(reference, ids, mask, labels), expected, atol=1e-5)
    assert (with_adapters - expected).abs().max() > 1e-2  # the adapters do change the policy
    assert torch.allclose(sequence_logprobs(policy, ids, mask, labels), with_adapters)  # and come back on
    assert not isinstance(reference, torch.nn.Module) and not hasattr(reference, "parameters")
    assert reference.policy is policy  # the same weights, not a copy of them
    assert [(p.data_ptr(), p.numel()) for p in policy.parameters()] == tensors_before  # and none added
    with pytest.raises(ValueError, match="frozen_copy"):
        without_adapters(_model())


def test_adapters_come_back_after_an_error():
    policy = _lora_policy()
    with pytest.raises(RuntimeError), adapters_disabled(policy):
        raise RuntimeError
    layers = [m for m in policy.modules() if hasattr(m, "enabled")]
    assert layers and all(m.enabled for m in layers)


def _pairs() -> list[PreferencePair]:
    gen = torch.Generator().manual_seed(1)
    def draw(n):
        return torch.randint(1, CONFIG.vocab_size, (n,), generator=gen).tolist()
    return [PreferencePair(draw(3), draw(2 + i % 4), draw(1 + i % 3)) for i in range(24)]


@pytest.mark.parametrize("make_reference", [frozen_copy, without_adapters], ids=["frozen-copy", "lora"])
def test_training_moves_the_policy_never_the_reference(make_reference):
    policy = add_lora(_model(), rank=2, alpha=4, targets=("qkv",)) if make_reference is without_adapters else _model()
    reference = make_reference(policy)
    pairs = _pairs()
    batch = dpo_batch(pairs)
    with torch.no_grad():
        reference_before = sequence_logprobs(reference, *batch)
    history = train_dpo(policy, reference, pairs, DPOConfig(steps=12, batch_size=8, lr=1e-2, beta=0.5))
    with torch.no_grad():
        assert torch.equal(sequence_logprobs(reference, *batch), reference_before)
    assert abs(history[0]["loss"] - math.log(2)) <= 1e-5  # the policy starts as the reference: margins of 0
    assert history[-1]["loss"] < 0.5 and history[-1]["accuracy"] > 0.8  # 24 pairs of random tokens: memorised


def test_dpo_batch_puts_chosen_then_rejected_and_labels_the_responses_only():
    pairs = [PreferencePair([1, 2], [3], [4, 5, 6]), PreferencePair([7], [8, 9], [10])]
    ids, mask, labels = dpo_batch(pairs)
    assert ids.tolist() == [[1, 2, 3, 0, 0], [7, 8, 9, 0, 0], [1, 2, 4, 5, 6], [7, 10, 0, 0, 0]]
    assert [row[row != IGNORE_INDEX].tolist() for row in labels] == [[3], [8, 9], [4, 5, 6], [10]]
    assert mask.sum(-1).tolist() == [3, 3, 5, 2]


def test_a_killed_and_resumed_run_is_bit_for_bit_the_run_in_one_go(tmp_path):
    pairs, cfg = _pairs(), DPOConfig(steps=8, batch_size=4, lr=1e-2, beta=0.5)
    whole = _model()
    history = train_dpo(whole, frozen_copy(whole), pairs, cfg)
    killed = _model()
    path = tmp_path / "dpo.pt"
    with pytest.raises(Interrupted):
        train_dpo(killed, dies_at_call(frozen_copy(killed), 6), pairs, cfg, checkpoint=path, checkpoint_every=4)
    resumed = _model()
    resumed_history = train_dpo(resumed, frozen_copy(resumed), pairs, cfg, checkpoint=path, resume=path)
    assert resumed_history == history
    for (name, p), q in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    with pytest.raises(ValueError, match="other settings"):
        train_dpo(_model(), frozen_copy(_model()), pairs[:-1], cfg, resume=path)


def test_on_step_adds_its_measurements_to_each_record_and_changes_nothing_else():
    pairs, cfg = _pairs(), DPOConfig(steps=6, batch_size=4, lr=1e-2, beta=0.5)
    plain_model, hooked_model = _model(), _model()
    plain = train_dpo(plain_model, frozen_copy(plain_model), pairs, cfg)
    seen = []

    def on_step(step: int) -> dict:
        seen.append((step, hooked_model.training))
        with torch.no_grad():  # a measurement that runs the policy, as a KL on its samples would
            hooked_model(torch.tensor([[1, 2, 3]]))
        return {"measured": step} if step % 3 == 0 else {}

    hooked = train_dpo(hooked_model, frozen_copy(hooked_model), pairs, cfg, on_step=on_step)
    assert seen == [(step, True) for step in range(1, 7)]
    assert [record.pop("measured", None) for record in hooked] == [None, None, 3, None, None, 6]
    assert hooked == plain
    for p, q in zip(plain_model.parameters(), hooked_model.parameters(), strict=True):
        assert torch.equal(p, q)
