"""Hugging Face interop: copy weights between our `GPT` and `GPT2LMHeadModel` / `LlamaForCausalLM` /
`MistralForCausalLM` (a Llama without biases; its sliding window is accepted only when it spans the context).

`transformers` is needed only here (it is in the `dev` extra) and is imported when these functions run.
Nothing is downloaded: models are built from configs or passed in.

Our names <-> Hugging Face names (block i):

| ours                        | GPT-2 (`GPT2LMHeadModel`)              | Llama (`LlamaForCausalLM`)                  |
|-----------------------------|----------------------------------------|---------------------------------------------|
| tok_emb.weight              | transformer.wte.weight                 | model.embed_tokens.weight                   |
| pos_emb.weight              | transformer.wpe.weight                 | (none: RoPE)                                |
| blocks.i.norm1              | transformer.h.i.ln_1                   | model.layers.i.input_layernorm              |
| blocks.i.attn.qkv           | transformer.h.i.attn.c_attn (Conv1D^T) | self_attn.q_proj, k_proj, v_proj stacked    |
|   (C + 2 H_kv D rows)       |                                        |   (k_proj, v_proj: H_kv D rows each, GQA)   |
| blocks.i.attn.out           | transformer.h.i.attn.c_proj (Conv1D^T) | self_attn.o_proj                            |
| blocks.i.norm2              | transformer.h.i.ln_2                   | model.layers.i.post_attention_layernorm     |
| blocks.i.mlp.fc_in          | transformer.h.i.mlp.c_fc (Conv1D^T)    | (none)                                      |
| blocks.i.mlp.fc_out         | transformer.h.i.mlp.c_proj (Conv1D^T)  | (none)                                      |
| blocks.i.mlp.w_in           | (none)                                 | mlp.gate_proj, mlp.up_proj stacked          |
| blocks.i.mlp.w_out          | (none)                                 | mlp.down_proj                               |
| final_norm                  | transformer.ln_f                       | model.norm                                  |
| lm_head                     | lm_head (tied to wte)                  | lm_head                                     |

GPT-2 stores its linear layers as `Conv1D` with weight (in, out), the transpose of `nn.Linear`'s (out, in).
Llama's RoPE uses the "rotate half" layout, which is ours too, so q/k need no permutation.
`MixtralForCausalLM` is a Mistral whose every MLP is a mixture of experts (`GPTConfig.moe`): our
blocks.i.mlp.router is its mlp.gate, and each expert's w_in / w_out its fused experts' rows (`_mixtral_groups`).
"""

from __future__ import annotations

import torch
from torch import nn

from .config import GPTConfig, MoESpec
from .gpt import GPT

GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def _kind(hf_model: nn.Module) -> str:
    name = type(hf_model).__name__
    if name == "GPT2LMHeadModel":
        return "gpt2"
    if name == "LlamaForCausalLM":
        return "llama"
    if name == "MistralForCausalLM":
        return "mistral"
    if name == "MixtralForCausalLM":
        return "mixtral"
    raise TypeError(f"expected a transformers GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM or "
                    f"MixtralForCausalLM, got {name}")


def config_from_hf(hf_config: object, kind: str) -> GPTConfig:
    """The GPTConfig equivalent to a GPT2Config, LlamaConfig or MistralConfig."""
    c = hf_config
    if kind == "gpt2":
        if c.activation_function not in GPT2_ACTIVATIONS:
            raise ValueError(f"unsupported GPT-2 activation {c.activation_function!r}; "
                             f"expected one of {sorted(GPT2_ACTIVATIONS)}")
        if getattr(c, "scale_attn_by_inverse_layer_idx", False) or not getattr(c, "scale_attn_weights", True):
            raise ValueError("only GPT-2's standard 1/sqrt(D) attention scaling is supported")
        return GPTConfig(
            vocab_size=c.vocab_size, context_length=c.n_positions, d_model=c.n_embd, n_heads=c.n_head,
            n_layers=c.n_layer, position="learned", norm="layernorm", norm_eps=c.layer_norm_epsilon,
            mlp=GPT2_ACTIVATIONS[c.activation_function], d_ff=c.n_inner or 4 * c.n_embd,
            attn_bias=True, mlp_bias=True, tie_weights=c.tie_word_embeddings, lm_head_bias=False,
        )
    n_kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    if c.num_attention_heads % n_kv_heads:
        raise ValueError(f"num_key_value_heads={n_kv_heads} must divide num_attention_heads={c.num_attention_heads}")
    window = getattr(c, "sliding_window", None)
    if window is not None and window < c.max_position_embeddings:
        raise ValueError(f"sliding-window attention is not supported: sliding_window={window} is shorter than "
                         f"max_position_embeddings={c.max_position_embeddings}; expected None")
    if c.hidden_act != "silu":
        raise ValueError(f"unsupported Llama activation {c.hidden_act!r}; expected 'silu' (SwiGLU)")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        raise ValueError(f"head_dim={head_dim} x heads={c.num_attention_heads} must equal hidden_size={c.hidden_size}")
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", 10000.0)}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only default RoPE is supported, got rope_type={rope['rope_type']!r}")
    moe = None
    if kind == "mixtral":  # every block a mixture of experts of width intermediate_size
        moe = MoESpec(n_experts=c.num_local_experts, top_k=c.num_experts_per_tok)
    return GPTConfig(
        vocab_size=c.vocab_size, context_length=c.max_position_embeddings, d_model=c.hidden_size,
        n_heads=c.num_attention_heads, n_layers=c.num_hidden_layers, position="rope", norm="rmsnorm",
        norm_eps=c.rms_norm_eps, mlp="swiglu", d_ff=c.intermediate_size,
        attn_bias=getattr(c, "attention_bias", False), mlp_bias=getattr(c, "mlp_bias", False),  # Mistral has none
        tie_weights=c.tie_word_embeddings, rope_theta=float(rope["rope_theta"]),
        n_kv_heads=None if n_kv_heads == c.num_attention_heads else n_kv_heads, moe=moe,
    )


def _gpt2_pairs(n_layers: int) -> list[tuple[str, str, bool]]:
    """(our name, HF name, transposed?) for every GPT-2 tensor."""
    pairs = [("tok_emb.weight", "transformer.wte.weight", False),
             ("pos_emb.weight", "transformer.wpe.weight", False),
             ("final_norm.weight", "transformer.ln_f.weight", False),
             ("final_norm.bias", "transformer.ln_f.bias", False)]
    for i in range(n_layers):
        ours, theirs = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("norm1", "ln_1"), ("norm2", "ln_2")):
            pairs += [(f"{ours}{a}.{p}", f"{theirs}{b}.{p}", False) for p in ("weight", "bias")]
        for a, b in (("attn.qkv", "attn.c_attn"), ("attn.out", "attn.c_proj"),
                     ("mlp.fc_in", "mlp.c_fc"), ("mlp.fc_out", "mlp.c_proj")):
            pairs += [(f"{ours}{a}.weight", f"{theirs}{b}.weight", True),
                      (f"{ours}{a}.bias", f"{theirs}{b}.bias", False)]
    return pairs


def _llama_groups(config: GPTConfig) -> list[tuple[str, list[str]]]:
    """(our name, [HF names concatenated along dim 0]) for every Llama tensor."""
    groups = [("tok_emb.weight", ["model.embed_tokens.weight"]), ("final_norm.weight", ["model.norm.weight"])]
    if not config.tie_weights:
        groups.append(("lm_head.weight", ["lm_head.weight"]))
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        groups += [(f"{ours}norm1.weight", [f"{theirs}input_layernorm.weight"]),
                   (f"{ours}norm2.weight", [f"{theirs}post_attention_layernorm.weight"])]
        suffixes = ["weight"] + (["bias"] if config.attn_bias else [])
        for s in suffixes:
            groups += [(f"{ours}attn.qkv.{s}", [f"{theirs}self_attn.{p}_proj.{s}" for p in "qkv"]),
                       (f"{ours}attn.out.{s}", [f"{theirs}self_attn.o_proj.{s}"])]
        if config.moe is not None and i >= config.moe.dense_layers:
            continue  # a mixture of experts: `_mixtral_groups`
        for s in ["weight"] + (["bias"] if config.mlp_bias else []):
            groups += [(f"{ours}mlp.w_in.{s}", [f"{theirs}mlp.gate_proj.{s}", f"{theirs}mlp.up_proj.{s}"]),
                       (f"{ours}mlp.w_out.{s}", [f"{theirs}mlp.down_proj.{s}"])]
    return groups


def _mixtral_groups(config: GPTConfig, theirs: dict[str, torch.Tensor]) -> list[tuple[str, list[torch.Tensor]]]:
    """(our name, [HF tensors, or views of them, concatenated along dim 0]) for each block's router and experts:
    transformers 5 stores a block's experts fused, gate_up_proj (E, 2F, C) and down_proj (E, C, F); transformers 4
    one module each, w1 (gate) and w3 (up) stacked into our w_in, w2 our w_out."""
    groups = []
    for i in range(config.n_layers):
        ours, prefix = f"blocks.{i}.mlp.", f"model.layers.{i}."
        if f"{prefix}mlp.experts.gate_up_proj" in theirs:
            gate_up, down = theirs[f"{prefix}mlp.experts.gate_up_proj"], theirs[f"{prefix}mlp.experts.down_proj"]
            groups.append((f"{ours}router.weight", [theirs[f"{prefix}mlp.gate.weight"]]))
            for e in range(config.moe.n_experts):
                groups += [(f"{ours}experts.{e}.w_in.weight", [gate_up[e]]),
                           (f"{ours}experts.{e}.w_out.weight", [down[e]])]
        else:
            moe = f"{prefix}block_sparse_moe."
            groups.append((f"{ours}router.weight", [theirs[f"{moe}gate.weight"]]))
            for e in range(config.moe.n_experts):
                expert = f"{moe}experts.{e}."
                w_in = [theirs[f"{expert}w1.weight"], theirs[f"{expert}w3.weight"]]
                groups += [(f"{ours}experts.{e}.w_in.weight", w_in),
                           (f"{ours}experts.{e}.w_out.weight", [theirs[f"{expert}w2.weight"]])]
    return groups


@torch.no_grad()
def from_hf(hf_model: nn.Module) -> GPT:
    """A GPT with the same config and weights as a Hugging Face GPT-2, Llama, Mistral or Mixtral causal LM."""
    kind = _kind(hf_model)
    config = config_from_hf(hf_model.config, kind)
    model = GPT(config)
    ours, theirs = model.state_dict(), hf_model.state_dict()
    if kind == "gpt2":
        for name, hf_name, transposed in _gpt2_pairs(config.n_layers):
            ours[name].copy_(theirs[hf_name].t() if transposed else theirs[hf_name])
    else:
        for name, hf_names in _llama_groups(config):
            ours[name].copy_(torch.cat([theirs[n] for n in hf_names], dim=0))
        if kind == "mixtral":
            for name, tensors in _mixtral_groups(config, theirs):
                ours[name].copy_(torch.cat(tensors, dim=0))
    return model


@torch.no_grad()
def to_hf(model: GPT, family: str | None = None) -> nn.Module:
    """The Hugging Face model (GPT-2 for learned positions + LayerNorm + GELU, Llama for RoPE + RMSNorm +
    SwiGLU, or Mistral with `family="mistral"`; Mixtral for a config with `moe`) with our weights copied in."""
    import transformers

    if family not in (None, "mistral"):
        raise ValueError(f"family must be None (GPT-2 or Llama, from the config) or 'mistral', got {family!r}")
    c = model.config
    ours = model.state_dict()
    if c.position == "learned" and c.norm == "layernorm" and c.mlp in ("gelu", "gelu_tanh", "relu") and not family:
        if not (c.attn_bias and c.mlp_bias and c.norm_bias and c.tie_weights and not c.lm_head_bias):
            raise ValueError("GPT-2 has biases everywhere, a tied head and no head bias; this config differs")
        if c.kv_heads != c.n_heads:
            raise ValueError(f"GPT-2 has no grouped-query attention: n_kv_heads={c.kv_heads}, "
                             f"expected n_heads={c.n_heads}")
        act = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}[c.mlp]
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=c.vocab_size, n_positions=c.context_length, n_embd=c.d_model, n_head=c.n_heads,
            n_layer=c.n_layers, n_inner=c.hidden_width, activation_function=act, layer_norm_epsilon=c.norm_eps,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True))
        theirs = hf.state_dict()
        for name, hf_name, transposed in _gpt2_pairs(c.n_layers):
            theirs[hf_name].copy_(ours[name].t() if transposed else ours[name])
    elif c.position == "rope" and c.norm == "rmsnorm" and c.mlp == "swiglu" and not c.lm_head_bias:
        common = dict(
            vocab_size=c.vocab_size, max_position_embeddings=c.context_length, hidden_size=c.d_model,
            intermediate_size=c.hidden_width, num_attention_heads=c.n_heads, num_key_value_heads=c.kv_heads,
            num_hidden_layers=c.n_layers, rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_weights,
            rope_theta=c.rope_theta)
        if c.moe is not None:
            m = c.moe
            if m.dense_layers or m.shared_d_ff or m.capacity_factor is not None or c.attn_bias or family:
                raise ValueError(f"Mixtral has a mixture of experts in every block, no shared expert, no capacity "
                                 f"factor and no attention biases; this config has {m} and attn_bias={c.attn_bias}")
            hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(
                **common | {"intermediate_size": m.d_ff or c.hidden_width}, sliding_window=None,
                num_local_experts=m.n_experts, num_experts_per_tok=m.top_k, router_jitter_noise=0.0))
        elif family == "mistral":
            if c.attn_bias or c.mlp_bias:
                raise ValueError("Mistral has no attention or MLP biases; this config has some")
            hf = transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=None))
        else:
            hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
                **common, attention_bias=c.attn_bias, mlp_bias=c.mlp_bias))
        theirs = hf.state_dict()
        groups = [(name, [theirs[n] for n in hf_names]) for name, hf_names in _llama_groups(c)]
        if c.moe is not None:
            groups += _mixtral_groups(c, theirs)
        for name, tensors in groups:  # each HF tensor (or a view of one) gets its rows of ours
            for tensor, part in zip(tensors, ours[name].split([t.size(0) for t in tensors], dim=0), strict=True):
                tensor.copy_(part)
    else:
        raise ValueError(f"no Hugging Face equivalent for position={c.position!r}, norm={c.norm!r}, mlp={c.mlp!r}: "
                         "expected GPT-2's (learned, layernorm, gelu) or Llama's (rope, rmsnorm, swiglu)")
    return hf.eval()
