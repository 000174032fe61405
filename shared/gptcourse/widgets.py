"""ipywidgets controls the lessons use: a parameter calculator and a temperature / top-k sampler.

Each control is a `VBox` whose result is an `HTML` child updated on change, so nothing is printed: the controls
work headless (nbval, nbconvert) and a saved notebook stays reproducible. Their `repr` is a one-line summary,
which is what a static viewer (GitHub) shows in place of the live widget.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import torch

from .inference.sampling import generate
from .model.config import GPTConfig
from .model.gpt import GPT
from .model.params import parameter_breakdown
from .text.char_tokenizer import CharTokenizer

_LABELS = {
    "token_embedding": "token embedding",
    "position_embedding": "learned positions",
    "attention": "attention (all blocks)",
    "mlp": "MLP (all blocks)",
    "block_norms": "block norms (all blocks)",
    "final_norm": "final norm",
    "output_projection": "output projection",
}
_EMBEDDINGS = ("token_embedding", "position_embedding", "output_projection")


def parameter_table(config: GPTConfig) -> str:
    """An HTML table of `parameter_breakdown(config)`, its total and the share held by the embeddings."""
    parts = parameter_breakdown(config)
    total = sum(parts.values())
    embeddings = sum(parts[k] for k in _EMBEDDINGS)
    rows = "".join(
        f"<tr><td>{_LABELS[k]}</td><td style='text-align:right'>{n:,}</td></tr>" for k, n in parts.items()
    )
    return (
        f"<table>{rows}<tr><td><b>total</b></td><td style='text-align:right'><b>{total:,}</b></td></tr></table>"
        f"<p>embeddings and output projection: {embeddings / total:.1%} of the parameters</p>"
    )


class ParameterCalculator(widgets.VBox):
    """V, d, N, tied and RoPE controls around a base config; the table shows the closed-form count.

    The number of heads, the norm and the MLP kind come from `base`; the MLP width keeps the base's ratio to d.
    A combination `GPTConfig` rejects (d not divisible by H, say) shows its error message instead of a count.
    """

    def __init__(self, base: GPTConfig) -> None:
        self.base = base
        self.vocab_size = widgets.BoundedIntText(value=base.vocab_size, min=1, max=1_000_000, description="V")
        self.d_model = widgets.BoundedIntText(value=base.d_model, min=1, max=65_536, description="d (C)")
        self.n_layers = widgets.IntSlider(value=base.n_layers, min=1, max=96, description="N")
        self.tied = widgets.Checkbox(value=base.tie_weights, description="tied output projection")
        self.rope = widgets.Checkbox(value=base.position == "rope", description="RoPE (else learned positions)")
        self.report = widgets.HTML()
        controls = (self.vocab_size, self.d_model, self.n_layers, self.tied, self.rope)
        super().__init__(children=(*controls, self.report))
        for control in controls:
            control.observe(self._update, names="value")
        self._update()

    def config(self) -> GPTConfig:
        """The config the controls describe (raises ValueError for an invalid combination)."""
        d = self.d_model.value
        d_ff = None if self.base.d_ff is None else round(self.base.d_ff * d / self.base.d_model)
        return self.base.replace(
            vocab_size=self.vocab_size.value, d_model=d, n_layers=self.n_layers.value, d_ff=d_ff,
            tie_weights=self.tied.value, position="rope" if self.rope.value else "learned",
        )

    def _update(self, change: object = None) -> None:
        try:
            self.report.value = parameter_table(self.config())
        except ValueError as err:
            self.report.value = f"<p style='color:#b00'>{html.escape(str(err))}</p>"

    def __repr__(self) -> str:
        return (f"ParameterCalculator(V={self.vocab_size.value}, d={self.d_model.value}, N={self.n_layers.value}, "
                f"tied={self.tied.value}, rope={self.rope.value})")


class TemperatureSampler(widgets.VBox):
    """A temperature slider and a top-k slider (0 = off) above a sample from `model` that follows them.

    The sampler's random generator is re-seeded for every sample, so the same settings give the same text.
    """

    def __init__(
        self, model: GPT, tokenizer: CharTokenizer, prompt: str, max_new_tokens: int = 120, seed: int = 0
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.prompt, self.max_new_tokens, self.seed = prompt, max_new_tokens, seed
        self.temperature = widgets.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.1, description="temperature")
        self.top_k = widgets.IntSlider(value=0, min=0, max=tokenizer.vocab_size, description="top-k (0 = off)")
        self.sample = widgets.HTML()
        super().__init__(children=(self.temperature, self.top_k, self.sample))
        self.temperature.observe(self._update, names="value")
        self.top_k.observe(self._update, names="value")
        self._update()

    def text(self) -> str:
        """The sample for the current settings (prompt included)."""
        idx = torch.tensor([self.tokenizer.encode(self.prompt)], dtype=torch.long)  # (1, T)
        out = generate(self.model, idx, self.max_new_tokens, temperature=self.temperature.value,
                       top_k=self.top_k.value or None, generator=torch.Generator().manual_seed(self.seed))
        return self.tokenizer.decode(out[0].tolist())

    def _update(self, change: object = None) -> None:
        self.sample.value = f"<pre>{html.escape(self.text())}</pre>"

    def __repr__(self) -> str:
        return f"TemperatureSampler(temperature={self.temperature.value}, top_k={self.top_k.value})"
