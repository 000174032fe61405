"""nanoGPT as the benchmark's peer: its own `model.py`, built as the same network with the same weights as ours.

nanoGPT is never vendored or downloaded. Point `NANOGPT_DIR` at a checkout of https://github.com/karpathy/nanoGPT
and `python -m gptcourse.bench` adds its line; without it the report says how to get one.

Only a GPT-2-shaped `GPTConfig` has a nanoGPT twin: learned positions, LayerNorm with eps 1e-5, exact GELU,
biases everywhere or nowhere, tied embeddings, no head bias, one key/value head per query head.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .model.config import GPTConfig
from .model.gpt import GPT

ENV = "NANOGPT_DIR"
GPT2_SHAPED = {"position": "learned", "norm": "layernorm", "norm_eps": 1e-5, "mlp": "gelu", "d_ff": None,
               "tie_weights": True, "lm_head_bias": False, "n_kv_heads": None}


def nanogpt_dir() -> Path | None:
    """The checkout `NANOGPT_DIR` names, or None when it is unset."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def load_nanogpt(directory: Path) -> ModuleType:
    """nanoGPT's `model.py` from a checkout, imported under its own name so it cannot shadow anything."""
    path = Path(directory) / "model.py"
    if not path.is_file():
        raise FileNotFoundError(f"{ENV}={directory}: expected a nanoGPT checkout with model.py in it "
                                "(git clone https://github.com/karpathy/nanoGPT)")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_gpt2_shaped(config: GPTConfig) -> None:
    wrong = {name: getattr(config, name) for name, want in GPT2_SHAPED.items() if getattr(config, name) != want}
    if config.attn_bias != config.mlp_bias or config.attn_bias != config.norm_bias:
        wrong["attn_bias/mlp_bias/norm_bias"] = (config.attn_bias, config.mlp_bias, config.norm_bias)
    if wrong:
        raise ValueError(f"nanoGPT builds only GPT-2-shaped networks; this config differs in {wrong}: expected "
                         f"{GPT2_SHAPED} and one bias setting for attention, MLP and norms")


def nanogpt_names(n_layers: int) -> dict[str, str]:
    """Our parameter names -> nanoGPT's (the tied head is the embedding table in both: one tensor, two names)."""
    names = {"tok_emb.weight": "transformer.wte.weight", "lm_head.weight": "lm_head.weight",
             "pos_emb.weight": "transformer.wpe.weight", "final_norm.weight": "transformer.ln_f.weight",
             "final_norm.bias": "transformer.ln_f.bias"}
    per_layer = {"norm1": "ln_1", "attn.qkv": "attn.c_attn", "attn.out": "attn.c_proj", "norm2": "ln_2",
                 "mlp.fc_in": "mlp.c_fc", "mlp.fc_out": "mlp.c_proj"}
    for i in range(n_layers):
        for ours, theirs in per_layer.items():
            for kind in ("weight", "bias"):
                names[f"blocks.{i}.{ours}.{kind}"] = f"transformer.h.{i}.{theirs}.{kind}"
    return names


def nanogpt_twin(ours: GPT, nanogpt: ModuleType) -> nn.Module:
    """nanoGPT's GPT with our model's configuration and a copy of its weights."""
    c = ours.config
    _check_gpt2_shaped(c)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        twin = nanogpt.GPT(nanogpt.GPTConfig(block_size=c.context_length, vocab_size=c.vocab_size,
                                             n_layer=c.n_layers, n_head=c.n_heads, n_embd=c.d_model, dropout=0.0,
                                             bias=c.attn_bias))
    names = nanogpt_names(c.n_layers)
    weights = {names[name]: value for name, value in ours.state_dict().items() if name in names}
    missing, unexpected = twin.load_state_dict(weights, strict=False)
    if missing or unexpected or len(weights) != len(ours.state_dict()):
        raise ValueError(f"nanoGPT's parameters do not match ours: missing {missing}, unexpected {unexpected}, "
                         f"ours without a name there {sorted(set(ours.state_dict()) - set(names))}")
    return twin


def nanogpt_train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                       grad_clip: float) -> Callable[[], object]:
    """One step as nanoGPT's train.py takes it in fp32: its forward computes the loss, backward, clip, step."""

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def nanogpt_optimizer(model: nn.Module, weight_decay: float, lr: float, betas: tuple[float, float]
                      ) -> torch.optim.Optimizer:
    """The AdamW nanoGPT's `configure_optimizers` makes on the CPU (fused only on CUDA there)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return model.configure_optimizers(weight_decay, lr, betas, "cpu")


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def op_counts(fn: Callable[[], object]) -> Counter[str]:
    """The aten operators one call of `fn` dispatches, by name: where two steps differ in work, not in time."""
    with _OpCounter() as counter:
        fn()
    return counter.counts
