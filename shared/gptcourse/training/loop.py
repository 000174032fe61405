"""A small training loop: AdamW, linear warmup then cosine decay, gradient accumulation, periodic evaluation,
checkpoints that resume bit for bit, and data parallelism across processes.

Run `python -m gptcourse.training` to train a character-level model on the default corpus, or
`python -m gptcourse.training --text PATH` on any text file; `--checkpoint PATH --checkpoint-every N` saves the
run and `--resume` continues it; `torchrun --nproc_per_node 2 -m gptcourse.training ...` trains on 2 processes.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..model.config import GPTConfig
from ..model.gpt import GPT
from ..text.char_tokenizer import CharTokenizer
from ..text.corpus import get_batch, load_text, train_val_split
from .checkpoint import resume_run, run_state, save_checkpoint
from .distributed import Ranks, current_ranks, join_process_group, leave_process_group, rank_rows


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 12
    block_size: int = 64
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta2: float = 0.99
    grad_clip: float = 1.0
    micro_batches: int = 1  # gradient accumulation: each step's batch is run in this many equal pieces
    eval_interval: int = 100
    eval_batches: int = 20
    seed: int = 0


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr, then cosine decay to cfg.min_lr at cfg.steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: GPT, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norm gains): torch's, for its fused kernel, whose
    update is lesson 09's `adamw_step` (tests/test_training_by_hand.py holds them equal over 1000 steps)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        # Speed: the fused kernel updates every tensor in one pass instead of ~10 small ops per tensor, about
        # 20x faster on the small model's step (see `python -m gptcourse.bench`); same update rule.
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=True)
    except RuntimeError:  # torch < 2.4 has no fused AdamW on the CPU
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2))


def lm_loss(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits (B, T, V) flattened to (B*T, V)."""
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, grad_clip: float,
    micro_batches: int = 1,
) -> torch.Tensor:
    """One optimisation step on the batch (x, y): loss, gradients, clipping to `grad_clip`, update.

    With micro_batches = k > 1 the batch is run in k equal pieces whose losses, each divided by k, are
    back-propagated one after the other: the gradients add up to the whole batch's (the mean over k means of
    equal size is the mean), while only one piece's activations are held at a time. Under
    DistributedDataParallel only the last piece all-reduces the gradients. Returns the batch's mean loss.
    """
    if x.size(0) % micro_batches:
        raise ValueError(f"a batch of {x.size(0)} rows does not split into micro_batches={micro_batches} "
                         "equal pieces: use a batch size that is a multiple of it")
    optimizer.zero_grad(set_to_none=True)
    loss = torch.zeros((), device=x.device)
    pieces = list(zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True))  # each (B / k, T)
    for i, (x_piece, y_piece) in enumerate(pieces):
        last = i == len(pieces) - 1
        no_sync = model.no_sync() if isinstance(model, DistributedDataParallel) and not last else None
        with no_sync or contextlib.nullcontext():
            piece_loss = lm_loss(model, x_piece, y_piece) / micro_batches  # / 1 is exact: k = 1 is a plain step
            piece_loss.backward()
        loss += piece_loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.detach()


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def estimate_loss(model: GPT, ids: torch.Tensor, cfg: TrainConfig, seed: int = 1234) -> float:
    """Mean loss over cfg.eval_batches fixed random batches (the same batches at every call)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    device = _device_of(model)
    losses = [lm_loss(model, *(t.to(device) for t in get_batch(ids, cfg.batch_size, cfg.block_size, gen))).item()
              for _ in range(cfg.eval_batches)]
    model.train(was_training)
    return sum(losses) / len(losses)


def data_fingerprint(ids: torch.Tensor) -> str:
    """A short hash of the training ids, so that a checkpoint is not resumed on other data."""
    return hashlib.sha256(ids.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


def _run_settings(model: GPT, train_ids: torch.Tensor, cfg: TrainConfig, micro_batch_rows: int) -> dict[str, dict]:
    """What a checkpoint must agree with to be resumed: the model, the training settings and the data.

    The micro-batch is recorded as its number of rows, not as the number per process: one process running two
    micro-batches of 6 and two ranks running one each do the same arithmetic, so either may resume the other.
    """
    settings = asdict(cfg)
    del settings["micro_batches"]
    settings["micro_batch_rows"] = micro_batch_rows
    return {"model_config": asdict(model.config), "train_config": settings,
            "data": {"tokens": len(train_ids), "sha256": data_fingerprint(train_ids)}}


def train(
    model: GPT,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    cfg: TrainConfig,
    progress: bool = True,
    on_eval: Callable[[dict], None] | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 0,
    resume: str | Path | None = None,
) -> list[dict]:
    """Train in place; returns the evaluations as [{"step", "train_loss", "val_loss", "lr"}, ...].

    checkpoint: write the run's whole state there every `checkpoint_every` steps (if > 0) and at the end: the
    model, the optimizer's moments, the step reached, the data sampler's and torch's random states and the
    evaluations so far. resume: a checkpoint to continue from (of the same model, settings and data), so that
    N steps, a save, a resume and N more give bit for bit the weights of 2N steps in one go.
    In a torch.distributed process group, each rank trains on its share of every batch (`cfg.batch_size` is
    the global batch) through DistributedDataParallel; rank 0 evaluates, shows progress and writes checkpoints.
    """
    if cfg.block_size > model.config.context_length:
        raise ValueError(f"block_size={cfg.block_size} exceeds context_length={model.config.context_length}")
    ranks = current_ranks()
    rows = rank_rows(cfg.batch_size, ranks)
    share = rows.stop - rows.start  # B / W
    if share % cfg.micro_batches:
        raise ValueError(f"each process's {share} rows (batch_size={cfg.batch_size} over "
                         f"{ranks.world_size} processes) do not split into micro_batches={cfg.micro_batches}")
    gen = torch.Generator().manual_seed(cfg.seed)
    optimizer = make_optimizer(model, cfg)
    history: list[dict] = []
    settings = _run_settings(model, train_ids, cfg, share // cfg.micro_batches)
    first_step = 0
    if resume is not None:
        first_step, history = resume_run(resume, settings, model, optimizer, gen)

    def save(step: int) -> None:
        if checkpoint is not None and ranks.is_main:
            save_checkpoint(checkpoint, run_state(settings, step, model, optimizer, gen, history))

    net: nn.Module = model
    if ranks.world_size > 1:
        net = DistributedDataParallel(model, device_ids=[_device_of(model)] if ranks.device != "cpu" else None)
    device = _device_of(model)
    model.train()
    bar = tqdm(range(first_step, cfg.steps), disable=not (progress and ranks.is_main), desc="training",
               initial=first_step, total=cfg.steps)
    for step in bar:
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(train_ids, cfg.batch_size, cfg.block_size, gen)  # (B, T): the global batch, every rank
        x, y = x[rows].to(device), y[rows].to(device)  # (B / W, T): this rank's share
        train_step(net, optimizer, x, y, cfg.grad_clip, cfg.micro_batches)
        if ranks.is_main and ((step + 1) % cfg.eval_interval == 0 or step + 1 == cfg.steps):
            record = {
                "step": step + 1,
                "train_loss": estimate_loss(model, train_ids, cfg),
                "val_loss": estimate_loss(model, val_ids, cfg),
                "lr": lr,
            }
            history.append(record)
            bar.set_postfix(val_loss=f"{record['val_loss']:.3f}")
            if on_eval is not None:
                on_eval(record)
        if checkpoint_every > 0 and (step + 1) % checkpoint_every == 0 and step + 1 < cfg.steps:
            save(step + 1)
    save(cfg.steps)
    return history


RECIPE_STEPS = 1600


def default_recipe(vocab_size: int, steps: int = RECIPE_STEPS) -> tuple[GPTConfig, TrainConfig]:
    """The course's character-level recipe, L4/H4/C128/T64/B12: lesson 07, the CLI and the benchmark use it.

    The model and batch are nanoGPT's README CPU recipe; its peak learning rate (and min_lr) is three times
    nanoGPT's, which reaches a lower validation loss in fewer steps on tiny Shakespeare. The MLP uses ReLU, not
    GPT-2's GELU: on a CPU exact GELU costs several times ReLU's time for no gain in loss at this size.
    Evaluation runs 8 times per run (every steps // 8), so a short run still draws a loss curve and a long one
    spends little of its time evaluating.
    """
    cfg = TrainConfig(steps=steps, batch_size=12, block_size=64, lr=3e-3, min_lr=3e-4,
                      warmup_steps=min(100, steps // 10), weight_decay=0.1, beta2=0.99,
                      eval_interval=max(1, steps // 8), eval_batches=20)
    model_config = GPTConfig(vocab_size=vocab_size, context_length=cfg.block_size, d_model=128, n_heads=4,
                             n_layers=4, mlp="relu")
    return model_config, cfg


def micro_batches_per_process(batch_size: int, micro_batch_size: int | None, ranks: Ranks) -> int:
    """How many micro-batches of `micro_batch_size` rows each of W processes runs for its batch_size / W rows.

    nanoGPT's rule: the micro-batch is fixed and the accumulation steps shrink as processes are added, so every
    step adds up the same pieces of the batch whatever W is (one process runs them in turn, W ranks in parallel).
    """
    rows = rank_rows(batch_size, ranks)
    share = rows.stop - rows.start  # B / W
    if micro_batch_size is None:
        return 1
    if micro_batch_size < 1 or share % micro_batch_size:
        raise ValueError(f"--micro-batch-size {micro_batch_size} does not divide each process's share of the batch: "
                         f"--batch-size {batch_size} over {ranks.world_size} processes is {share} rows each; "
                         f"choose a divisor of {share}")
    return share // micro_batch_size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m gptcourse.training",
        description="Train a character-level GPT on a text file (`default_recipe`). Under torchrun, each process "
        "trains on its share of every batch.")
    parser.add_argument("--text", help="a UTF-8 text file (default: standard-library source)")
    parser.add_argument("--steps", type=int, default=RECIPE_STEPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, help="the global batch, split across processes (default 12)")
    parser.add_argument("--micro-batch-size", type=int, metavar="ROWS",
                        help="rows per forward and backward pass (default: all of a process's rows); the rest is "
                        "gradient accumulation. Fixed, it makes W processes do the arithmetic of one: same "
                        "command, same thread count, bitwise the same weights")
    parser.add_argument("--checkpoint", help="write the run's state to this file (at the end, and every "
                        "--checkpoint-every steps)")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="N")
    parser.add_argument("--resume", action="store_true",
                        help="continue from --checkpoint if it exists (else start from step 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--eval-batches", type=int, help="batches per evaluation during training (default 20)")
    parser.add_argument("--final-eval-batches", type=int, default=200,
                        help="batches for the precise val loss printed at the end (default 200)")
    args = parser.parse_args(argv)
    if (args.resume or args.checkpoint_every) and not args.checkpoint:
        parser.error("--resume and --checkpoint-every need --checkpoint PATH")

    text = load_text(args.text)
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = train_val_split(torch.tensor(tok.encode(text), dtype=torch.long))
    model_config, cfg = default_recipe(tok.vocab_size, args.steps)
    cfg = replace(cfg, seed=args.seed, batch_size=args.batch_size or cfg.batch_size,
                  eval_batches=args.eval_batches or cfg.eval_batches)
    ranks = join_process_group()
    try:
        try:
            cfg = replace(cfg, micro_batches=micro_batches_per_process(cfg.batch_size, args.micro_batch_size, ranks))
        except ValueError as error:
            parser.error(str(error))
        _train_and_report(args, model_config, cfg, train_ids, val_ids, ranks)
    finally:
        leave_process_group()


def _train_and_report(args: argparse.Namespace, model_config: GPTConfig, cfg: TrainConfig, train_ids: torch.Tensor,
                      val_ids: torch.Tensor, ranks: Ranks) -> None:
    torch.manual_seed(args.seed)
    model = GPT(model_config).to(ranks.device)
    resume = args.checkpoint if args.resume and Path(args.checkpoint).is_file() else None
    if args.resume and resume is None and ranks.is_main:
        print(f"no checkpoint at {args.checkpoint} yet: starting at step 0")
    start = time.perf_counter()
    history = train(model, train_ids, val_ids, cfg, progress=not args.no_progress, checkpoint=args.checkpoint,
                    checkpoint_every=args.checkpoint_every, resume=resume)
    wall = time.perf_counter() - start
    if not ranks.is_main:
        return
    # The loop's estimate uses cfg.eval_batches batches, like nanoGPT's eval_iters; a larger sample is printed
    # too, because a 20-batch estimate wobbles by about +-0.02.
    precise = estimate_loss(model, val_ids, replace(cfg, eval_batches=args.final_eval_batches))
    processes = f", {ranks.world_size} processes" if ranks.world_size > 1 else ""
    print(f"val loss {history[-1]['val_loss']:.4f} ({cfg.eval_batches} batches; {precise:.4f} on "
          f"{args.final_eval_batches}) after {cfg.steps} iterations in {wall:.1f} s "
          f"({torch.get_num_threads()} threads{processes}, evaluations included)")
