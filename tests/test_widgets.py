"""The lesson widgets work headless and report the same numbers as independent references."""

import pytest
import torch

from gptcourse import GPT, CharTokenizer, generate, preset
from gptcourse.widgets import ParameterCalculator, TemperatureSampler


@pytest.mark.parametrize(("name", "published"), [("gpt2-small", 124_439_808), ("llama2-7b", 6_738_415_616)])
def test_calculator_shows_published_counts(name: str, published: int) -> None:
    assert f"{published:,}" in ParameterCalculator(preset(name)).report.value


def test_calculator_controls_change_the_count_and_report_bad_widths() -> None:
    calc = ParameterCalculator(preset("seed-tiny"))
    calc.tied.value = False
    assert "27,296" in calc.report.value  # the assembly seed's untied count
    calc.d_model.value = 30  # 30 / 4 heads is not an integer
    assert "not divisible" in calc.report.value


def test_sampler_follows_its_controls() -> None:
    tok = CharTokenizer.from_text("abcdefgh")
    torch.manual_seed(0)
    model = GPT(preset("seed-tiny").replace(vocab_size=tok.vocab_size, context_length=32))
    sampler = TemperatureSampler(model, tok, prompt="abc", max_new_tokens=10)
    sampler.temperature.value = 0.0
    greedy = generate(model, torch.tensor([tok.encode("abc")]), 10, temperature=0)
    assert sampler.text() == tok.decode(greedy[0].tolist())
    assert sampler.text() in sampler.sample.value
