"""Data parallelism: two gloo processes started by torchrun on loopback end with the weights of one plain
process (the global batch split between them), gradient accumulation gives the whole batch's gradient, and a
batch that does not split evenly is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gptcourse import GPT, GPTConfig, TrainConfig, train
from gptcourse.training.checkpoint import load_checkpoint
from gptcourse.training.distributed import Ranks, rank_rows
from gptcourse.training.loop import lm_loss, main, train_step

CORPUS = "the quick brown fox jumps over the lazy dog. " * 120


def _cli(checkpoint, *more: str) -> list[str]:
    return ["-m", "gptcourse.training", "--text", str(checkpoint.parent / "corpus.txt"), "--steps", "20",
            "--no-progress", "--eval-batches", "1", "--final-eval-batches", "1", "--checkpoint", str(checkpoint),
            *more]


def test_torchrun_with_two_gloo_processes_ends_with_the_weights_of_one_process(tmp_path):
    """The same command with a fixed micro-batch: 2 ranks = 1 plain process, bit for bit (one thread each)."""
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    one, whole, two = tmp_path / "one.pt", tmp_path / "whole.pt", tmp_path / "two.pt"
    subprocess.run([sys.executable, *_cli(one, "--micro-batch-size", "6")], env=env, check=True, capture_output=True,
                   timeout=300)
    subprocess.run([sys.executable, *_cli(whole)], env=env, check=True, capture_output=True, timeout=300)
    run = subprocess.run(_torchrun(*_cli(two, "--micro-batch-size", "6")), env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "after 20 iterations" in run.stdout and "2 processes" in run.stdout, run.stdout
    a, b = load_checkpoint(one)["model"], load_checkpoint(two)["model"]
    # Each rank's gradient of its 6 rows, halved and summed by the all-reduce, is exactly what one process
    # computes from its two micro-batches of 6 (halving is exact in floating point): bit for bit the same run.
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), f"{name}: 2 ranks differ from 1 process: {(tensor - b[name]).abs().max()}"
    # One pass over all 12 rows sums them in another order: equal up to rounding, which Adam amplifies where a
    # gradient is near zero; how much depends on the CPU's kernels (under 1e-5 on one machine, 2.1e-5 on another,
    # with the same one thread): bounded at 1e-4, a tenth of a single lr-sized step.
    c = load_checkpoint(whole)["model"]
    d = c["tok_emb.weight"].shape[1]  # C: qkv.bias holds the query, key and value parts, C each
    for name, tensor in c.items():
        other = b[name]
        if name.endswith("attn.qkv.bias"):
            # The key bias's exact gradient is zero (softmax ignores a shift shared by all keys), so both runs
            # update it from rounding noise alone, which Adam scales up towards lr: compare the query and value
            # parts to 1e-4 and bound the key part by a few steps of lr (3e-3).
            key = slice(d, 2 * d)
            assert (tensor[key] - other[key]).abs().max() < 3e-3 * 3
            tensor, other = torch.cat([tensor[:d], tensor[2 * d:]]), torch.cat([other[:d], other[2 * d:]])
        assert torch.allclose(tensor, other, rtol=0, atol=1e-4), f"{name}: {(tensor - other).abs().max():.2e}"


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]


def test_a_run_killed_on_one_process_resumes_on_two_ranks_bit_for_bit(tmp_path):
    """With the micro-batch fixed, a checkpoint does not depend on the number of processes that wrote it."""
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    straight, killed = tmp_path / "straight.pt", tmp_path / "killed.pt"
    subprocess.run([sys.executable, *_cli(straight, "--micro-batch-size", "6")], env=env, check=True,
                   capture_output=True, timeout=300)
    args = _cli(killed, "--micro-batch-size", "6", "--checkpoint-every", "5", "--resume")
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not killed.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert load_checkpoint(killed)["step"] < 20, "the one-process run finished before it could be killed"
    run = subprocess.run(_torchrun(*args), env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2 processes" in run.stdout, run.stdout
    a, b = load_checkpoint(straight)["model"], load_checkpoint(killed)["model"]
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), f"{name}: resumed on 2 ranks, differs by {(tensor - b[name]).abs().max()}"


@pytest.mark.parametrize(("argv", "message"), [
    (["--micro-batch-size", "5"], "--micro-batch-size 5 does not divide each process's share of the batch: "
                                  "--batch-size 12 over 1 processes is 12 rows each; choose a divisor of 12"),
    (["--micro-batch-size", "0"], "--micro-batch-size 0 does not divide"),
])
def test_a_micro_batch_that_does_not_divide_the_batch_is_refused_before_training(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--steps", "1", "--no-progress", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_accumulated_micro_batches_give_the_whole_batch_gradient():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, context_length=8, d_model=16, n_heads=2, n_layers=1))
    x, y = torch.randint(0, 20, (2, 12, 8))  # (B, T) each, B = 12
    lm_loss(model, x, y).backward()
    whole = [p.grad.clone() for p in model.parameters()]

    class Recorder(torch.optim.SGD):  # lr 0: keeps the weights, lets train_step run its full step
        def step(self, closure=None):
            self.grads = [p.grad.clone() for p in model.parameters()]

    for pieces in (2, 3, 4):
        recorder = Recorder(model.parameters(), lr=0.0)
        train_step(model, recorder, x, y, grad_clip=1e9, micro_batches=pieces)
        for g, h in zip(whole, recorder.grads, strict=True):
            assert torch.allclose(g, h, atol=1e-6), f"{pieces} micro-batches: {(g - h).abs().max():.2e}"
    with pytest.raises(ValueError, match="12 rows does not split into micro_batches=5"):
        train_step(model, recorder, x, y, grad_clip=1.0, micro_batches=5)


def test_each_rank_takes_an_equal_contiguous_share():
    assert [rank_rows(12, Ranks(r, 3)) for r in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 12)]
    with pytest.raises(ValueError, match="batch_size=10 does not split evenly across 4 processes"):
        rank_rows(10, Ranks(0, 4))
    ids = torch.arange(500) % 20
    model = GPT(GPTConfig(vocab_size=20, context_length=8, d_model=16, n_heads=2, n_layers=1))
    with pytest.raises(ValueError, match=r"6 rows .* do not split into micro_batches=4"):
        train(model, ids, ids, TrainConfig(steps=1, batch_size=6, block_size=8, micro_batches=4), progress=False)
