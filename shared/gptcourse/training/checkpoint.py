"""Checkpoints that a run can be killed around: written atomically, read back with clear errors.

`save_checkpoint` writes to a temporary file in the same folder, flushes it to disk and renames it over the old
one (`os.replace`: atomic on POSIX, which Python documents; on Windows it replaces too, but atomicity is not
promised), so PATH is the previous checkpoint or the new one, never half of one: a run killed while writing
resumes from the previous save. `load_checkpoint`
reads only tensors and plain Python values (`weights_only=True`, so a checkpoint cannot run code) and says
what is wrong with a file that is missing, truncated, or from another run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

FORMAT = "gptcourse-checkpoint-1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: missing, truncated, or written by a different run."""


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write `state` (tensors and plain values) to `path` atomically: write a temporary file, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        torch.save({"format": FORMAT, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state saved at `path`; CheckpointError if it is missing, truncated or not a gptcourse checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path} is not a complete checkpoint ({path.stat().st_size:,} bytes): it is "
                              f"truncated or was not written by gptcourse.train ({type(err).__name__}: {err})"
                              ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a gptcourse checkpoint (expected format {FORMAT!r})")
    return state


def check_same_run(state: dict[str, Any], expected: dict[str, Any], path: str | Path) -> None:
    """Refuse to resume from a checkpoint whose settings (model config, training config, data) differ."""
    differences = [f"{key}.{field}: checkpoint {saved.get(field)!r}, this run {value!r}"
                   for key, wanted in expected.items()
                   for saved in [state.get(key) or {}]
                   for field, value in wanted.items() if saved.get(field) != value]
    if differences:
        raise CheckpointError(f"{path} was written by a run with other settings; resume with the same ones or "
                              "start a new checkpoint:\n  " + "\n  ".join(differences))


def run_state(settings: dict[str, Any], step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              data_rng: torch.Generator, history: list[dict]) -> dict[str, Any]:
    """What a checkpoint of a training run holds: its settings, the step reached, the model, the optimizer's
    state, the data sampler's and torch's random states, and the evaluations so far."""
    return settings | {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                       "data_rng": data_rng.get_state(), "torch_rng": torch.get_rng_state(), "history": history}


def resume_run(path: str | Path, settings: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               data_rng: torch.Generator) -> tuple[int, list[dict]]:
    """Restore a `run_state` checkpoint (refused if another run's) into the model, the optimizer, the data
    sampler and torch's random state; returns the step reached and the history so far."""
    state = load_checkpoint(path)
    check_same_run(state, settings, path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    data_rng.set_state(state["data_rng"])
    torch.set_rng_state(state["torch_rng"])
    return state["step"], list(state["history"])
