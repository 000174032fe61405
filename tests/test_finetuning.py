"""Padding and attention masks, the heads that read the last real token, the finetuning losses and LoRA, each
against an independent reference: every sequence run alone, slow loops written here, closed forms, and Hugging
Face's GPT2ForSequenceClassification, GPT2LMHeadModel(labels=...) and peft's LoRA on the `to_hf()` model."""

from __future__ import annotations

import math
import random

import pytest
import torch

from gptcourse import (
    GPT,
    IGNORE_INDEX,
    LINE_KINDS,
    GPTConfig,
    LoRALinear,
    RewardModel,
    SequenceClassifier,
    ValueHead,
    add_lora,
    bradley_terry_loss,
    count_parameters,
    generate,
    greedy_until_stop,
    keywordless_line_kind_task,
    line_kind_task,
    load_text,
    lora_parameter_count,
    masked_lm_loss,
    merge_lora,
    pad_batch,
    padding_mask,
    preference_task,
    response_labels,
    signature_task,
)

GPT2_LIKE = GPTConfig(vocab_size=53, context_length=24, d_model=32, n_heads=4, n_layers=2, mlp="gelu_tanh")
LLAMA_LIKE = GPTConfig(vocab_size=53, context_length=24, d_model=32, n_heads=4, n_layers=2, position="rope",
                       norm="rmsnorm", mlp="swiglu", tie_weights=False)
LENGTHS = [5, 11, 1, 8]  # batch of 4, padded to 11


def _model(config: GPTConfig, fused: bool = True) -> GPT:
    torch.manual_seed(0)
    model = GPT(config).eval()
    with torch.no_grad():  # larger than the init, so attention patterns are far from uniform
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    for block in model.blocks:
        block.attn.fused = fused
    return model


def _sequences(vocab: int, lengths: list[int], low: int = 1) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(low, vocab) for _ in range(n)] for n in lengths]


def _real_rows(mask: torch.Tensor) -> list[torch.Tensor]:
    return [row.nonzero().squeeze(-1) for row in mask]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("config", [GPT2_LIKE, LLAMA_LIKE, LLAMA_LIKE.replace(n_kv_heads=1)],
                         ids=["learned", "rope", "rope-multi-query"])
def test_each_real_token_gets_the_logits_of_its_sequence_run_alone(config, fused, side):
    model = _model(config, fused)
    sequences = _sequences(config.vocab_size, LENGTHS)
    ids, mask = pad_batch(sequences, pad_id=0, side=side)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask)  # (B, T, V)
        other_pads = model(ids.masked_fill(mask == 0, 7), attention_mask=mask)
        for b, (seq, real) in enumerate(zip(sequences, _real_rows(mask), strict=True)):
            alone = model(torch.tensor([seq]))[0]  # (T_b, V)
            assert (batch[b, real] - alone).abs().max() <= 1e-5
            assert (other_pads[b, real] - alone).abs().max() <= 1e-5  # the pad id does not matter
    assert torch.isfinite(batch).all()  # pad rows attend to themselves: no empty softmax


def test_without_the_mask_padding_changes_the_real_tokens():  # the test above can fail
    model = _model(GPT2_LIKE)
    ids, mask = pad_batch(_sequences(53, LENGTHS), side="left")
    with torch.no_grad():
        alone = model(ids[:1, mask[0].bool()])[0]
        assert (model(ids)[0, mask[0].bool()] - alone).abs().max() > 1e-2


def test_padding_mask_matches_a_loop():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    got = padding_mask(mask)
    assert got.shape == (3, 1, 5, 5) and got.dtype == torch.bool
    for b in range(3):
        for i in range(5):
            for j in range(5):
                assert bool(got[b, 0, i, j]) == (j <= i and (bool(mask[b, j]) or i == j)), (b, i, j)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, T\)"):
        padding_mask(torch.ones(5))


def test_all_ones_mask_is_the_plain_causal_model():
    model = _model(LLAMA_LIKE)
    ids = torch.randint(0, 53, (3, 9))
    with torch.no_grad():
        assert (model(ids, attention_mask=torch.ones_like(ids)) - model(ids)).abs().max() <= 1e-5


@pytest.mark.parametrize(("mask", "message"), [
    (torch.ones(2, 4), r"shape of the token ids \(2, 5\)"),
    (torch.full((2, 5), 2), "only 1 \\(real token\\) and 0 \\(pad\\)"),
])
def test_bad_attention_masks_are_refused(mask, message):
    model = _model(GPT2_LIKE)
    with pytest.raises(ValueError, match=message):
        model(torch.zeros(2, 5, dtype=torch.long), attention_mask=mask)
    with pytest.raises(ValueError, match="KV cache together are not supported"):
        model(torch.zeros(2, 5, dtype=torch.long), cache=model.new_cache(), attention_mask=torch.ones(2, 5))


# ---- heads


@pytest.mark.parametrize("side", ["right", "left"])
def test_classifier_and_reward_read_the_last_real_token(side):
    torch.manual_seed(0)
    classifier = SequenceClassifier(_model(LLAMA_LIKE), 3).eval()
    reward = RewardModel(classifier.backbone).eval()
    sequences = _sequences(53, LENGTHS)
    ids, mask = pad_batch(sequences, side=side)
    with torch.no_grad():
        logits, rewards = classifier(ids, mask), reward(ids, mask)
        assert logits.shape == (4, 3) and rewards.shape == (4,)
        for b, seq in enumerate(sequences):
            alone = torch.tensor([seq])
            assert (logits[b] - classifier(alone)[0]).abs().max() <= 1e-5
            assert abs(rewards[b] - reward(alone)[0]) <= 1e-5
        # Without the mask, every sequence but the longest gets a wrong reward: right-padded, position -1 is a pad;
        # left-padded, its real tokens attend to the pads before them, at shifted positions.
        unmasked = reward(ids)
        wrong = [abs(float(unmasked[b] - reward(torch.tensor([s]))[0])) > 1e-4 for b, s in enumerate(sequences)]
        assert wrong == [len(s) != max(LENGTHS) for s in sequences]


def test_value_head_is_zero_on_pads_and_per_token_elsewhere():
    value = ValueHead(_model(GPT2_LIKE)).eval()
    sequences = _sequences(53, LENGTHS)
    ids, mask = pad_batch(sequences, side="left")
    with torch.no_grad():
        values = value(ids, mask)
        assert values.shape == ids.shape and bool((values[mask == 0] == 0).all())
        for b, (seq, real) in enumerate(zip(sequences, _real_rows(mask), strict=True)):
            expected = value.backbone.forward_hidden(torch.tensor([seq]))[0] @ value.head.weight[0] + value.head.bias
            assert (values[b, real] - expected).abs().max() <= 1e-5


def test_n_classes_is_checked():
    with pytest.raises(ValueError, match="n_classes must be a positive int, got 0"):
        SequenceClassifier(_model(GPT2_LIKE), 0)


transformers = pytest.importorskip("transformers")
PAD = 0  # never a real token below: the sequences draw ids from 1..V-1


@pytest.mark.parametrize("side", ["right", "left"])
def test_classifier_logits_equal_gpt2_for_sequence_classification(side):
    torch.manual_seed(0)
    ours = SequenceClassifier(_model(GPT2_LIKE), 5).eval()
    hf_config = ours.backbone.to_hf().config
    hf_config.num_labels, hf_config.pad_token_id = 5, PAD
    hf = transformers.GPT2ForSequenceClassification(hf_config).eval()
    hf.transformer.load_state_dict(ours.backbone.to_hf().transformer.state_dict())
    with torch.no_grad():
        hf.score.weight.copy_(ours.head.weight)
        ids, mask = pad_batch(_sequences(53, LENGTHS), pad_id=PAD, side=side)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # HF takes positions as given; ours count real tokens
        expected = hf(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        assert (ours(ids, mask) - expected).abs().max() <= 1e-5


def test_instruction_loss_equals_gpt2_lm_head_model_with_labels():
    model = _model(GPT2_LIKE)
    sequences = _sequences(53, [5, 11, 9, 6])
    prompt_lengths = torch.tensor([2, 4, 3, 5])
    ids, mask = pad_batch(sequences, pad_id=PAD)
    labels = response_labels(ids, prompt_lengths, mask)
    with torch.no_grad():
        expected = model.to_hf()(input_ids=ids, attention_mask=mask, labels=labels).loss
        ours = masked_lm_loss(model(ids, attention_mask=mask), labels)
        every_token = masked_lm_loss(model(ids, attention_mask=mask), ids)
    assert abs(float(ours - expected)) <= 1e-5
    assert abs(float(ours - every_token)) > 1e-3  # the -100s matter


def test_response_labels_match_a_loop_on_either_side():
    sequences = _sequences(53, [6, 3, 8])
    prompt_lengths = [2, 1, 5]
    for side in ("right", "left"):
        ids, mask = pad_batch(sequences, pad_id=PAD, side=side)
        labels = response_labels(ids, torch.tensor(prompt_lengths), mask)
        for b, (seq, n_prompt) in enumerate(zip(sequences, prompt_lengths, strict=True)):
            expected = [IGNORE_INDEX] * n_prompt + seq[n_prompt:]
            real = labels[b, mask[b].bool()].tolist()
            assert real == expected and bool((labels[b, mask[b] == 0] == IGNORE_INDEX).all())


def test_bradley_terry_loss_is_the_closed_form():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.5, 30.0]), torch.tensor([1.0, 1.0, 0.5, -30.0])
    expected = sum(math.log(1 + math.exp(-(c - r))) for c, r in zip(chosen.tolist(), rejected.tolist(),
                                                                   strict=True)) / 4
    assert abs(float(bradley_terry_loss(chosen, rejected)) - expected) <= 1e-6
    assert float(bradley_terry_loss(torch.tensor([-200.0]), torch.tensor([200.0]))) == pytest.approx(400.0)


# ---- LoRA


def test_lora_counts_follow_the_closed_form_and_start_as_the_base_model():
    model = _model(GPT2_LIKE)
    ids = torch.randint(0, 53, (2, 7))
    with torch.no_grad():
        before = model(ids)
    targets = ("qkv", "out", "fc_in", "fc_out")
    add_lora(model, rank=3, alpha=6.0, targets=targets)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    c, f, n = GPT2_LIKE.d_model, GPT2_LIKE.hidden_width, GPT2_LIKE.n_layers
    assert trainable == lora_parameter_count(GPT2_LIKE, 3, targets) == n * 3 * (4 * c + 2 * c + 2 * (c + f))
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert frozen == count_parameters(GPT2_LIKE)
    with torch.no_grad():
        assert torch.equal(model(ids), before)  # B = 0: the update starts at zero


def test_lora_count_of_grouped_query_attention_is_the_adapters_it_adds():
    config = LLAMA_LIKE.replace(n_kv_heads=1)  # a qkv projection of C + 2 D outputs, not 3C
    model = _model(config)
    add_lora(model, rank=2, alpha=4.0, targets=("qkv",))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == lora_parameter_count(config, 2, ("qkv",))


def test_lora_trains_only_a_and_b_and_keeps_a_head_trainable():
    classifier = SequenceClassifier(_model(LLAMA_LIKE), 2)
    add_lora(classifier, rank=2, alpha=2.0, targets=("qkv", "w_out"), keep_trainable=("head",))
    names = {name for name, p in classifier.named_parameters() if p.requires_grad}
    assert names == {"head.weight"} | {f"backbone.blocks.{i}.{m}.{ab}" for i in range(2)
                                       for m in ("attn.qkv", "mlp.w_out") for ab in "AB"}
    assert sum(p.numel() for p in classifier.parameters() if p.requires_grad) == (
        lora_parameter_count(LLAMA_LIKE, 2, ("qkv", "w_out")) + 2 * LLAMA_LIKE.d_model)
    with pytest.raises(ValueError, match=r"no nn.Linear named \['qvk'\].*named \[.*'qkv'"):
        add_lora(_model(GPT2_LIKE), 2, 2.0, targets=("qvk",))
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        lora_parameter_count(GPT2_LIKE, 2, ("q",))


def _randomise_lora(model: torch.nn.Module) -> None:
    torch.manual_seed(3)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.B.normal_(0, 0.2)


def test_merge_lora_keeps_the_logits():
    model = _model(LLAMA_LIKE)
    add_lora(model, rank=4, alpha=8.0, targets=("qkv", "out", "w_in", "w_out"))
    _randomise_lora(model)
    ids = torch.randint(0, 53, (2, 9))
    with torch.no_grad():
        before = model(ids)
        merge_lora(model)
        assert not any(isinstance(m, LoRALinear) for m in model.modules())
        assert (model(ids) - before).abs().max() <= 1e-5
        assert (before - _model(LLAMA_LIKE)(ids)).abs().max() > 1e-2  # the update did something


def test_lora_equals_peft_on_the_hugging_face_model():
    peft = pytest.importorskip("peft")
    base = _model(GPT2_LIKE)
    hf = base.to_hf()
    ours = add_lora(base, rank=4, alpha=8.0, targets=("qkv", "out"))
    _randomise_lora(ours)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "attn.c_proj"], lora_dropout=0.0,
                             fan_in_fan_out=True, bias="none")
    theirs = peft.get_peft_model(hf, config).eval()
    with torch.no_grad():
        for i, block in enumerate(ours.blocks):
            for our_name, hf_module in (("qkv", theirs.base_model.model.transformer.h[i].attn.c_attn),
                                        ("out", theirs.base_model.model.transformer.h[i].attn.c_proj)):
                lora = getattr(block.attn, our_name)
                hf_module.lora_A["default"].weight.copy_(lora.A)
                hf_module.lora_B["default"].weight.copy_(lora.B)
        ids = torch.randint(0, 53, (3, 10))
        assert (theirs(input_ids=ids).logits - ours(ids)).abs().max() <= 1e-5
    trainable, _ = theirs.get_nb_trainable_parameters()
    assert trainable == sum(p.numel() for p in ours.parameters() if p.requires_grad)
    assert trainable == lora_parameter_count(GPT2_LIKE, 4, ("qkv", "out"))


# ---- tasks and padding


def test_pad_batch_on_either_side():
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=2)
    assert ids.tolist() == [[5, 6, 7], [8, 2, 2]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=2, side="left")
    assert ids.tolist() == [[5, 6, 7], [2, 2, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="side must be 'left' or 'right'"):
        pad_batch([[1]], side="middle")
    with pytest.raises(ValueError, match="no empty ones"):
        pad_batch([[1], []])


def test_tasks_are_deterministic_and_labelled_right():
    text = load_text()
    kinds = line_kind_task(text)
    assert kinds == line_kind_task(text) and len(kinds) == 300 * len(LINE_KINDS)
    starts = {0: ("#",), 1: ("def ", "class "), 2: ("return",), 3: ("if ", "elif ", "for ", "while ")}
    assert all(line.startswith(starts[label]) and len(line) <= 48 for line, label in kinds)
    signatures = signature_task(text)
    assert signatures == signature_task(text) and len(signatures) > 250
    for prompt, response in signatures:
        name = prompt.removeprefix("signature of ").removesuffix(":\n")
        assert response.startswith(f"def {name}(") and response.removesuffix(":\n") in text
    pairs = preference_task(text, n=500)
    assert pairs == preference_task(text, n=500) and len(set(pairs)) == 500
    for chosen, rejected in pairs:
        assert chosen != rejected and sorted(chosen.split(" ")) == sorted(rejected.split(" "))
        assert chosen.split(" ")[0] == rejected.split(" ")[0] and chosen in text


@pytest.mark.parametrize("config", [GPT2_LIKE, LLAMA_LIKE], ids=["learned", "rope"])
def test_greedy_until_stop_equals_recomputed_greedy_one_prompt_at_a_time_cut_at_the_stop(config):
    model = _model(config).double()  # float64: the cached batch and the recomputed lone prompt pick the same argmax
    prompts = _sequences(config.vocab_size, [*LENGTHS, 5, 8])  # two lengths twice: rows that share a batch
    limit = config.context_length
    full = [generate(model, torch.tensor([p]), limit - len(p), temperature=0.0, use_cache=False)[0, len(p):].tolist()
            for p in prompts]  # each prompt alone, every step recomputed, until its window is full
    stop_id = full[0][3]  # prompt 0 stops at its 4th token at the latest; the others wherever stop_id comes
    expected = [answer[: answer.index(stop_id) + 1] if stop_id in answer else answer for answer in full]
    assert greedy_until_stop(model, prompts, stop_id, limit) == expected
    assert len(expected[0]) <= 4 and expected[0][-1] == stop_id
    assert len(expected[0]) != len(expected[4])  # the two rows of length 5 stop at different steps
    filled = [len(p) + len(answer) == limit and answer[-1] != stop_id
              for p, answer in zip(prompts, expected, strict=True)]
    assert any(filled)  # some prompt never emits stop_id and ends with its window full
    assert greedy_until_stop(model, prompts, stop_id, 2) == [answer[:2] for answer in expected]
    with pytest.raises(ValueError, match="leaves no room to answer"):
        greedy_until_stop(model, [*prompts, [1] * limit], stop_id, 1)
    with pytest.raises(ValueError, match="stop_id must be a token id"):
        greedy_until_stop(model, prompts, config.vocab_size, 1)


def test_greedy_until_stop_feeds_each_token_once():
    """With the KV cache a step feeds one new token per running row: every prompt token and every answer token but
    the last goes through the model once, and a row that has stopped is fed nothing more."""
    model = _model(GPT2_LIKE).double()
    prompts = _sequences(GPT2_LIKE.vocab_size, [*LENGTHS, 5, 8])
    stop_id = greedy_until_stop(model, prompts[:1], 0, 1)[0][0]  # prompt 0's first token: it stops at once
    shapes = []
    hook = model.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    try:
        said = greedy_until_stop(model, prompts, stop_id, 6)
    finally:
        hook.remove()
    assert said[0] == [stop_id] and any(len(a) == 6 for a in said)
    assert sum(b * t for b, t in shapes) == sum(len(p) + len(a) - 1 for p, a in zip(prompts, said, strict=True))
    assert len(shapes) == sum(max(len(a) for p, a in zip(prompts, said, strict=True) if len(p) == n)
                              for n in set(map(len, prompts)))  # each length's rows run as one batch


def test_keywordless_line_kinds_are_the_line_kinds_without_their_keyword():
    text = load_text()
    keywords = {0: ("#",), 1: ("def", "class"), 2: ("return",), 3: ("if", "elif", "for", "while")}
    pairs = keywordless_line_kind_task(text, per_class=50, seed=3)
    originals = line_kind_task(text, per_class=50, seed=3)
    assert [label for _, label in pairs] == [label for _, label in originals]
    for (rest, label), (line, _) in zip(pairs, originals, strict=True):
        assert rest and rest == rest.strip() and line.endswith(rest)
        assert line[: len(line) - len(rest)].rstrip() in keywords[label]  # exactly the keyword (and spaces) cut
