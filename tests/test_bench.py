"""The benchmark script runs and reports what it promises (a smoke test: no speed is asserted)."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptcourse import GPT, GPTConfig
from gptcourse.bench import QUICK, TARGETS, batch1_linears, flops_per_token, model_config


@pytest.fixture(scope="module")
def quick_report() -> dict:
    env = {name: value for name, value in os.environ.items() if name != "NANOGPT_DIR"}  # the peer is opt-in
    proc = subprocess.run([sys.executable, "-m", "gptcourse.bench", "--quick", "--json"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_quick_json_has_every_section(quick_report):
    r = quick_report
    assert r["quick"] is True
    assert set(r["machine"]) >= {"torch", "threads"}
    assert r["machine"]["threads"] >= 1
    assert [row["config"] for row in r["training"]] == [shape.name for shape in QUICK["shapes"]]
    for row in r["training"]:
        for key in ("peak_gflops", "ours_tokens_per_s", "hf_tokens_per_s", "hf_same_tokens_per_s", "ours_mfu",
                    "ours_over_hf", "ours_over_hf_same"):
            assert row[key] > 0, (key, row)
        # The ratios and MFU are the ones the raw timings imply.
        assert row["ours_over_hf"] == pytest.approx(row["hf_ms_per_step"] / row["ours_ms_per_step"])
        assert row["ours_over_hf_same"] == pytest.approx(row["hf_same_ms_per_step"] / row["ours_ms_per_step"])
        assert row["ours_mfu"] == pytest.approx(row["ours_tokens_per_s"] * row["flops_per_token"]
                                                / (row["peak_gflops"] * 1e9))
    assert [row["T"] for row in r["attention"]] == list(QUICK["attention_lengths"])
    for row in r["attention"]:
        assert row["fused_over_explicit"] == pytest.approx(row["explicit_ms"] / row["fused_ms"])
    kept = r["attention_memory_kept"]  # the longest T again, in a child process whose allocator reuses memory
    if platform.libc_ver()[0] == "glibc":
        assert kept["T"] == QUICK["attention_lengths"][-1]
        assert kept["fused_over_explicit"] == pytest.approx(kept["explicit_ms"] / kept["fused_ms"])
    else:
        assert kept is None
    assert [row["T"] for row in r["tiled_attention"]] == list(QUICK["tiled_lengths"])
    for row in r["tiled_attention"]:  # explicit, tiled and SDPA: peak memory and time, forward and with backward
        for name in ("explicit", "tiled", "sdpa"):
            for part in ("fwd", "fwd_bwd"):
                assert row[f"{name}_{part}_ms"] > 0 and row[f"{name}_{part}_peak_mb"] >= 0
        t = row["T"]  # explicit attention's backward keeps (T, T) weights: at least one float32 (T, T) is allocated
        assert row["explicit_fwd_bwd_peak_mb"] * 2**20 >= t * t * 4
    gen = r["generation"]
    assert gen["new_tokens"] == QUICK["generate_tokens"]
    assert gen["cache_over_recompute"] == pytest.approx(gen["recompute_s"] / gen["cache_s"])
    linears_s = gen["new_tokens"] * gen["linears_ms"] / 1e3  # a whole generation's worth of batch-1 linears
    assert gen["ratio_without_overhead"] == pytest.approx(gen["recompute_s"] / linears_s)
    assert gen["linears_gb_per_s"] == pytest.approx(gen["linear_weights_mb"] / gen["linears_ms"])
    cli = r["command_line"]
    assert cli["help_over_python"] == pytest.approx(cli["help_ms"] / cli["python_ms"])
    assert cli["check_env_over_python"] == pytest.approx(cli["check_env_ms"] / cli["python_ms"])
    opt = r["optimizer"]  # our AdamW's step against torch's fused one
    assert opt["config"] == QUICK["shapes"][0].name and opt["parameters"] > 0
    assert opt["ours_over_fused"] == pytest.approx(opt["ours_ms_per_step"] / opt["fused_ms_per_step"])
    assert opt["ours_as_fast"] is (opt["ours_over_fused"] <= 1)
    gqa = r["generation_gqa"]  # GQA with a quarter of the kv heads against MHA, side by side
    assert gqa["n_kv_heads"] * 4 == gqa["n_heads"] == QUICK["gqa_shape"].n_heads
    assert gqa["mha_cache_bytes"] == 4 * gqa["gqa_cache_bytes"] > 0
    assert gqa["gqa_over_mha_tokens_per_s"] == pytest.approx(gqa["gqa_tokens_per_s"] / gqa["mha_tokens_per_s"])
    assert gqa["gqa_parameters"] < gqa["mha_parameters"]
    bpe = r["bpe"]
    assert bpe["vocab_size"] == QUICK["bpe_vocab_size"] and bpe["naive_same_merges"] is True
    assert bpe["ours_over_naive"] == pytest.approx(bpe["naive_s"] / bpe["ours_s"])
    assert bpe["rust_over_ours"] == pytest.approx(bpe["rust_s"] / bpe["ours_s"])


def test_every_target_is_reported_with_its_verdict(quick_report):
    targets = {t["name"]: t for t in quick_report["targets"]}
    assert set(targets) == set(TARGETS)
    for name, t in targets.items():
        assert t["target"] == TARGETS[name]
        if name == "ours_over_nanogpt_small":  # without NANOGPT_DIR there is no nanoGPT to measure
            assert t["value"] is None and t["met"] is None
        else:
            assert t["met"] is (t["value"] >= t["target"])


STANDIN = Path(__file__).parent / "nanogpt_standin"  # nanoGPT's interface, written for the tests


def test_without_nanogpt_the_report_says_how_to_get_it(quick_report):
    from gptcourse.bench import report

    assert "nanoGPT: not measured, NANOGPT_DIR is not set" in report(quick_report)
    assert "target ours/nanoGPT >= 1.05x: not measured" in report(quick_report)


@pytest.mark.parametrize("bias", [True, False])
def test_the_nanogpt_twin_is_the_same_network_with_the_same_weights(bias, capsys):
    from gptcourse.nanogpt_peer import load_nanogpt, nanogpt_twin

    config = GPTConfig(vocab_size=11, context_length=8, d_model=16, n_heads=2, n_layers=2, attn_bias=bias,
                       mlp_bias=bias, norm_bias=bias)
    torch.manual_seed(0)
    ours = GPT(config)
    with torch.no_grad():  # biases and gains away from their 0 and 1, so that a swapped name shows
        for p in ours.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    twin = nanogpt_twin(ours, load_nanogpt(STANDIN))
    assert capsys.readouterr().out == ""  # nanoGPT's prints are kept out of the benchmark's output
    idx = torch.randint(11, (3, 8), generator=torch.Generator().manual_seed(1))
    logits, _ = twin(idx)
    torch.testing.assert_close(logits, ours(idx), rtol=0, atol=1e-5)
    assert twin.lm_head.weight is twin.transformer.wte.weight  # still tied after the copy


def test_the_nanogpt_twin_refuses_a_network_nanogpt_does_not_build():
    from gptcourse.nanogpt_peer import load_nanogpt, nanogpt_twin

    with pytest.raises(ValueError, match=r"GPT-2-shaped.*'mlp': 'relu'"):
        nanogpt_twin(GPT(GPTConfig(mlp="relu")), load_nanogpt(STANDIN))
    with pytest.raises(FileNotFoundError, match="expected a nanoGPT checkout with model"):
        load_nanogpt(STANDIN.parent / "no-such-checkout")


def test_the_nanogpt_line_times_both_steps_and_counts_their_operators(monkeypatch):
    from gptcourse import bench

    monkeypatch.setenv("NANOGPT_DIR", str(STANDIN))
    row = bench.bench_nanogpt(QUICK["shapes"][0], rounds=1)
    assert row["logits_max_abs_diff"] < 1e-5
    assert row["ours_over_nanogpt"] == pytest.approx(row["nanogpt_ms_per_step"] / row["ours_ms_per_step"])
    assert row["ours_over_nanogpt_fused_adamw"] == pytest.approx(
        row["nanogpt_fused_adamw_ms_per_step"] / row["ours_ms_per_step"])
    # nanoGPT's CPU AdamW updates each tensor with its own ops; ours is torch's fused kernel
    assert row["ops_differing"]["aten._fused_adamw_"][1] == 0 < row["ops_differing"]["aten._fused_adamw_"][0]
    assert row["ops_differing"]["aten.lerp_"][0] == 0 < row["ops_differing"]["aten.lerp_"][1]


@pytest.mark.parametrize("shape", QUICK["shapes"], ids=lambda s: s.name)
def test_the_hf_peer_is_gpt2_as_transformers_ships_it(shape):
    from transformers import GPT2Config

    from gptcourse.bench import hf_gpt2

    hf = hf_gpt2(shape).hf_model
    shipped = GPT2Config()
    assert (hf.config.n_layer, hf.config.n_head, hf.config.n_embd, hf.config.n_positions) == (
        shape.n_layers, shape.n_heads, shape.d_model, shape.block_size)
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "activation_function", "layer_norm_epsilon"):
        assert getattr(hf.config, name) == getattr(shipped, name), name


@pytest.mark.parametrize("shape", QUICK["shapes"], ids=lambda s: s.name)
def test_flops_per_token_is_nanogpt_formula(shape):
    config = model_config(shape)
    model = GPT(config)
    # Independent count: the model's own parameters, without the position table (it does no matmul).
    n = sum(p.numel() for p in model.parameters()) - model.pos_emb.weight.numel()
    expected = 6 * n + 12 * shape.n_layers * shape.d_model * shape.block_size
    assert flops_per_token(config) == expected


@pytest.mark.parametrize("shape", QUICK["shapes"], ids=lambda s: s.name)
def test_batch1_linears_reads_every_matmul_weight_once(shape):
    config = model_config(shape)
    assert config.tie_weights and config.mlp == "relu" and not config.d_ff  # the closed form below assumes these
    apply, read, weight_bytes = batch1_linears(GPT(config), tokens=2)
    # Per block: q, k, v and the output projection (4 C^2), the MLP's two (2 x 4 C^2); then the tied (V, C) head.
    c, n_layers = config.d_model, config.n_layers
    assert weight_bytes == 4 * (12 * n_layers * c * c + config.vocab_size * c)
    apply()
    read()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the kept-memory rerun uses glibc's knobs")
def test_attention_rerun_uses_the_parents_threads_and_reports_a_failing_child(monkeypatch):
    from gptcourse import bench

    calls = []
    real_run = subprocess.run

    def spy(cmd, **kwargs):
        calls.append((cmd, kwargs["env"]))
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(bench.subprocess, "run", spy)
    monkeypatch.setattr(bench.torch, "get_num_threads", lambda: 1)
    assert bench.bench_attention_memory_kept(8, 1)["T"] == 8
    cmd, env = calls[0]
    assert cmd[cmd.index("--threads") + 1] == "1"
    assert all(env[name] == value for name, value in bench.KEEP_MEMORY.items())
    with pytest.raises(RuntimeError, match="freed memory kept failed"):
        bench.bench_attention_memory_kept(-1, 1)  # no sequence has length -1: the child fails


def test_peak_allocated_bytes_is_the_most_held_at_once():
    """Two 4 MB tensors alive together peak at 8 MB; the same two one after the other, at 4 MB."""
    from gptcourse.bench import peak_allocated_bytes

    mb4 = 2**20  # float32 numbers in 4 MiB

    def together() -> None:
        a, b = torch.ones(mb4), torch.ones(mb4)
        del a, b

    def in_turn() -> None:
        for _ in range(2):
            torch.ones(mb4)

    assert 8 * 2**20 <= peak_allocated_bytes(together) < 8.1 * 2**20
    assert 4 * 2**20 <= peak_allocated_bytes(in_turn) < 4.1 * 2**20


def test_report_has_the_tiled_attention_lines(quick_report):
    from gptcourse.bench import report

    lines = [line for line in report(quick_report).splitlines() if "(blocks of" in line]
    assert len(lines) == 2 * len(QUICK["tiled_lengths"]) and all("tiled" in line and "sdpa" in line for line in lines)


def test_without_a_gpu_the_report_says_why_there_is_no_gpu_line(quick_report):
    from gptcourse.bench import report

    assert quick_report["tiled_attention_gpu"] is None  # this machine has no GPU; a GPU machine reports rows
    assert "on a GPU: none here" in report(quick_report)


def test_flash_attn_joins_the_comparison_only_on_a_gpu_where_installed(monkeypatch):
    """`flash-attn` is CUDA-only: on the CPU it is never asked for, on a GPU only when its package is found."""
    import importlib.util

    from gptcourse import bench

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "flash_attn" else None)
    assert list(bench.tiled_methods("cpu")) == ["explicit", "tiled", "sdpa"]
    assert list(bench.tiled_methods("cuda")) == ["explicit", "tiled", "sdpa", "flash_attn"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert list(bench.tiled_methods("cuda")) == ["explicit", "tiled", "sdpa"]


def test_a_gpu_result_is_reported_with_its_precision_and_flash_attn_status(quick_report):
    """The GPU rows have the CPU rows' form; here CPU rows in bfloat16, relabelled as a GPU's, stand in for them."""
    from gptcourse.bench import bench_tiled_attention, report

    rows = bench_tiled_attention(QUICK["tiled_lengths"], QUICK["tiled_block"], 1, dtype=torch.bfloat16)
    gpu = [row | {"device": "cuda"} for row in rows]
    text = report(quick_report | {"tiled_attention_gpu": gpu})
    assert "on the GPU (bfloat16" in text and "flash-attn is not installed" in text
    assert sum("(blocks of" in line for line in text.splitlines()) == 4 * len(QUICK["tiled_lengths"])


def test_the_compile_line_is_reported_only_when_asked(quick_report):
    from gptcourse.bench import report

    assert quick_report["compiled"] is None and "first step (compiling)" not in report(quick_report)
    row = {"config": "L2", "compile_s": 95.0, "compiled_ms_per_step": 30.0, "eager_ms_per_step": 36.0,
           "compiled_over_eager": 1.2}
    assert "first step (compiling) 95 s, then 30.0 ms/step against eager 36.0 ms: 1.20x" in report(
        quick_report | {"compiled": row})
