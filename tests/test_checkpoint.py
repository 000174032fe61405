"""Checkpoints: N steps + save + resume + N steps is bit for bit 2N steps, also after a real SIGKILL of the
command line at a random moment; a half-written save never replaces a good one; other runs' checkpoints and
truncated files are refused with a message saying why."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gptcourse import GPT, GPTConfig, TrainConfig, train
from gptcourse.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

CORPUS = "the quick brown fox jumps over the lazy dog. " * 120
CONFIG = GPTConfig(vocab_size=28, context_length=16, d_model=32, n_heads=2, n_layers=2)
CFG = TrainConfig(steps=12, batch_size=8, block_size=16, lr=3e-3, min_lr=3e-4, warmup_steps=3,
                  eval_interval=4, eval_batches=2)


def corpus_ids() -> tuple[torch.Tensor, torch.Tensor]:
    chars = sorted(set(CORPUS))
    ids = torch.tensor([chars.index(ch) for ch in CORPUS])
    return ids[:4800], ids[4800:]


def fresh_model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG)


def test_save_resume_continue_is_bitwise_a_straight_run(tmp_path):
    train_ids, val_ids = corpus_ids()
    straight = fresh_model()
    straight_history = train(straight, train_ids, val_ids, CFG, progress=False)

    # The same run, stopped at step 8 (an exception from the evaluation hook): its last save is step 6's.
    path6 = tmp_path / "run6.pt"

    class Stop(Exception):
        pass

    def stop_at_8(record):
        if record["step"] == 8:
            raise Stop

    with pytest.raises(Stop):
        train(fresh_model(), train_ids, val_ids, CFG, progress=False, on_eval=stop_at_8, checkpoint=path6,
              checkpoint_every=6)
    assert load_checkpoint(path6)["step"] == 6
    resumed = fresh_model()  # a new process would start from the same fresh weights
    history = train(resumed, train_ids, val_ids, CFG, progress=False, resume=path6)
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q), f"{name} differs after resume by {(p - q).abs().max():.2e}"
    assert history == straight_history
    # Without the optimizer's moments the same resume drifts: the test can tell.
    state = load_checkpoint(path6)
    state["optimizer"]["state"] = {}
    save_checkpoint(path6, {k: v for k, v in state.items() if k != "format"})
    amnesiac = fresh_model()
    train(amnesiac, train_ids, val_ids, CFG, progress=False, resume=path6)
    assert not all(torch.equal(p, q) for p, q in zip(straight.parameters(), amnesiac.parameters(), strict=True))


def test_a_checkpoint_of_another_run_or_a_truncated_file_is_refused(tmp_path):
    train_ids, val_ids = corpus_ids()
    path = tmp_path / "run.pt"
    train(fresh_model(), train_ids, val_ids, replace(CFG, steps=2), progress=False, checkpoint=path)
    with pytest.raises(CheckpointError, match=r"other settings(?s:.*)train_config.lr: checkpoint 0.003, this run 0.01"):
        train(fresh_model(), train_ids, val_ids, replace(CFG, steps=2, lr=1e-2), progress=False, resume=path)
    with torch.device("meta"):
        wider = GPT(replace(CONFIG, d_model=64))
    with pytest.raises(CheckpointError, match=r"model_config.d_model: checkpoint 32, this run 64"):
        train(wider.to_empty(device="cpu"), train_ids, val_ids, replace(CFG, steps=2), progress=False, resume=path)
    with pytest.raises(CheckpointError, match=r"data.sha256"):
        train(fresh_model(), train_ids.flip(0), val_ids, replace(CFG, steps=2), progress=False, resume=path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"not a complete checkpoint .*truncated"):
        train(fresh_model(), train_ids, val_ids, replace(CFG, steps=2), progress=False, resume=path)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError, match="not a gptcourse checkpoint"):
        load_checkpoint(path)


def test_a_save_that_dies_midway_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "run.pt"
    save_checkpoint(path, {"step": 1})

    def dies(obj, f):
        f.write(b"PK\x03\x04 half of a zip")
        raise KeyboardInterrupt  # the process dies here, before the rename

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"step": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gptcourse.training", "--steps", "24", "--batch-size", "4",
            "--no-progress", "--eval-batches", "1",
            "--final-eval-batches", "1", *args]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def test_sigkill_at_a_random_moment_then_resume_gives_the_straight_weights(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text(CORPUS, encoding="utf-8")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    common = ("--text", str(text))
    subprocess.run(_cli(*common, "--checkpoint", str(tmp_path / "straight.pt")), env=env, check=True,
                   capture_output=True, timeout=300)
    killed = tmp_path / "killed.pt"
    args = _cli(*common, "--checkpoint", str(killed), "--checkpoint-every", "3", "--resume")
    rng = random.Random()
    kills = 0
    for _ in range(2):  # kill twice, each time a random moment after its first save
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not killed.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=60)
    assert kills, "the run finished before it could be killed"
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "after 24 iterations" in done.stdout
    straight, resumed = _weights(tmp_path / "straight.pt"), _weights(killed)
    for name, tensor in straight.items():
        assert torch.equal(tensor, resumed[name]), f"{name} differs after SIGKILL + --resume"


def test_the_command_line_needs_a_checkpoint_path_to_resume(capsys):
    from gptcourse.training.loop import main

    with pytest.raises(SystemExit):
        main(["--steps", "1", "--resume"])
    assert "--resume and --checkpoint-every need --checkpoint PATH" in capsys.readouterr().err
