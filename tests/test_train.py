"""Training: the loop lowers the loss, the schedule follows its closed form, the fused step is plain AdamW."""

import itertools
import math
from dataclasses import replace

import pytest
import torch

from gptcourse import GPT, GPTConfig, TrainConfig, default_recipe, estimate_loss, lr_at, train
from gptcourse.training.loop import lm_loss, main, make_optimizer, train_step

CORPUS = "the quick brown fox jumps over the lazy dog. " * 120  # 5,400 chars, 28 symbols, very predictable


def corpus_ids() -> tuple[torch.Tensor, torch.Tensor, int]:
    chars = sorted(set(CORPUS))
    ids = torch.tensor([chars.index(ch) for ch in CORPUS])
    n = int(0.9 * len(ids))
    return ids[:n], ids[n:], len(chars)


def test_training_lowers_val_loss_from_uniform():
    train_ids, val_ids, vocab = corpus_ids()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, context_length=16, d_model=32, n_heads=2, n_layers=2))
    cfg = TrainConfig(steps=150, batch_size=8, block_size=16, lr=3e-3, min_lr=3e-4, warmup_steps=10,
                      eval_interval=50, eval_batches=4)
    before = estimate_loss(model, val_ids, cfg)
    # At initialisation the logits are near zero, so the loss is near that of a uniform guess: ln V.
    assert abs(before - math.log(vocab)) < 0.15, f"initial loss {before:.3f}, expected about ln {vocab}"
    history = train(model, train_ids, val_ids, cfg, progress=False)
    assert [h["step"] for h in history] == [50, 100, 150]
    assert set(history[0]) == {"step", "train_loss", "val_loss", "lr"}
    # One repeated sentence: after 150 steps the model should predict most characters.
    assert history[-1]["val_loss"] < 0.3 * math.log(vocab), history
    assert history[-1]["val_loss"] < history[0]["val_loss"]


def test_lr_schedule_matches_closed_form():
    cfg = TrainConfig(steps=1000, lr=2e-3, min_lr=2e-4, warmup_steps=100)
    # Linear warmup: step s (0-based) uses lr * (s + 1) / warmup, reaching lr on the last warmup step.
    assert lr_at(0, cfg) == pytest.approx(2e-3 / 100)
    assert lr_at(49, cfg) == pytest.approx(2e-3 * 50 / 100)
    assert lr_at(99, cfg) == pytest.approx(2e-3)
    # Cosine from lr at the end of warmup to min_lr at `steps`, passing the average halfway.
    assert lr_at(100, cfg) == pytest.approx(2e-3)
    assert lr_at(550, cfg) == pytest.approx((2e-3 + 2e-4) / 2)
    quarter = 2e-4 + 0.5 * (1 + math.cos(math.pi / 4)) * (2e-3 - 2e-4)
    assert lr_at(325, cfg) == pytest.approx(quarter)
    assert lr_at(1000, cfg) == pytest.approx(2e-4)
    assert lr_at(5000, cfg) == pytest.approx(2e-4)  # stays at the floor past the end
    after_warmup = [lr_at(s, cfg) for s in range(100, 1001)]
    assert all(a >= b for a, b in itertools.pairwise(after_warmup))


def test_train_step_is_clipped_adamw_with_decay_on_matrices_only():
    torch.manual_seed(0)
    # No attention biases: the key bias gets a zero gradient (softmax ignores a constant shift), and Adam blows
    # that rounding noise up to +-lr, which would differ between any two correct implementations.
    config = GPTConfig(vocab_size=20, context_length=8, d_model=16, n_heads=2, n_layers=1, attn_bias=False)
    model, reference = GPT(config), GPT(config)
    reference.load_state_dict(model.state_dict())
    cfg = TrainConfig(lr=1e-2, weight_decay=0.1, beta2=0.95, grad_clip=0.5)
    x, y = torch.randint(0, 20, (2, 4, 8))
    optimizer = make_optimizer(model, cfg)
    # Independent reference: torch's plain for-loop AdamW on the same groups, clipping by hand.
    matrices = [p for p in reference.parameters() if p.dim() >= 2]
    vectors = [p for p in reference.parameters() if p.dim() < 2]
    plain = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.9, 0.95), foreach=False, fused=False)
    for _ in range(3):
        train_step(model, optimizer, x, y, cfg.grad_clip)
        plain.zero_grad()
        lm_loss(reference, x, y).backward()
        grads = [p.grad for p in reference.parameters()]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        for g in grads:
            g.mul_(min(1.0, 0.5 / (norm.item() + 1e-6)))
        plain.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), f"{name} differs from plain AdamW by {(p - q).abs().max():.2e}"


def test_default_recipe_keeps_the_lesson_signature():
    config, cfg = default_recipe(65, steps=123)
    assert cfg.steps == 123
    assert config.vocab_size == 65
    assert config.context_length >= cfg.block_size
    assert cfg.min_lr <= cfg.lr and cfg.warmup_steps < 123


def test_cli_prints_loss_iterations_and_time(tmp_path, capsys):
    path = tmp_path / "corpus.txt"
    path.write_text(CORPUS, encoding="utf-8")
    main(["--text", str(path), "--steps", "8", "--no-progress", "--eval-batches", "2", "--final-eval-batches", "2"])
    out = capsys.readouterr().out
    assert out.startswith("val loss ") and "(2 batches; " in out and "on 2) after 8 iterations in " in out, out


def test_block_size_longer_than_context_is_refused():
    train_ids, val_ids, vocab = corpus_ids()
    model = GPT(GPTConfig(vocab_size=vocab, context_length=8))
    with pytest.raises(ValueError, match="block_size=16 exceeds context_length=8"):
        train(model, train_ids, val_ids, replace(TrainConfig(), block_size=16, steps=1), progress=False)
