"""Calling the student's code from a case's `run`: build their module with reference weights, take their
outputs as plain tensors, and describe their exceptions in words (with the line of *their* code that raised)."""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..checks import fail, fmt_shape

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


def build_module(cls: Any, what: str, kwargs: dict[str, Any], weights: dict[str, torch.Tensor]) -> nn.Module:
    """`cls(**kwargs)` with the reference `weights` loaded, so random initialisation never decides a grade."""
    module = module_class(cls, what)(**kwargs)
    load_weights(module, weights, what)
    return module.eval()


def module_class(cls: Any, what: str) -> type[nn.Module]:
    """`cls`, if it is a class derived from nn.Module (what a lab asks for); else a failure naming what it got."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise fail(f"{what}: expected a class derived from nn.Module, got {type(cls).__name__} {cls!r}")
    return cls


def load_weights(module: nn.Module, weights: dict[str, torch.Tensor], what: str) -> None:
    """Copy `weights` into `module`'s parameters; the lab fixes their names and shapes."""
    # every name of a shared (tied) parameter is listed, so a tied head is filled whichever name comes first
    have = {name: tuple(p.shape) for name, p in module.named_parameters(remove_duplicate=False)}
    want = {name: tuple(w.shape) for name, w in weights.items()}
    listing = ", ".join(f"{n} {fmt_shape(s)}" for n, s in want.items())
    missing, unexpected = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or unexpected:
        found = ", ".join(f"{n} {fmt_shape(s)}" for n, s in have.items()) or "none"
        raise fail(f"{what} has parameters [{found}]; the lab fixes their names and shapes: [{listing}]"
                   + (f". Missing: {missing}" if missing else "")
                   + (f". Unexpected: {unexpected}" if unexpected else ""))
    for name, shape in want.items():
        if have[name] != shape:
            hint = " (transposed: nn.Linear(in, out).weight has shape (out, in))" if have[name] == shape[::-1] else ""
            raise fail(f"{what}: parameter {name} has shape {fmt_shape(have[name])}, expected {fmt_shape(shape)}"
                       f"{hint}. The lab fixes: [{listing}]")
    params = dict(module.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, w in weights.items():
            params[name].copy_(w)


class TensorsMade(TorchDispatchMode):
    """Inside `with TensorsMade() as made:`, the shape of every tensor a torch operation returns, in order
    (`made.shapes`): what a call computed on its way, which its result alone does not show (a row lookup and a
    one-hot product give the same embeddings; only the product makes a (B, T, V) matrix). Measured in the graded
    kernel, it reaches the grader as plain data in the case's outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.shapes.extend(tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def as_tensor(value: Any, what: str) -> torch.Tensor:
    """The student's result as a plain, detached CPU tensor; a clear failure if it is not a tensor."""
    if not isinstance(value, torch.Tensor):
        raise fail(f"{what} returned {type(value).__name__}, expected a torch.Tensor")
    return value.detach().cpu().as_subclass(torch.Tensor)


def as_number(value: Any, what: str, expected: str, kinds: tuple[type, ...] = (int, float)) -> Any:
    """The student's number: a Python number of `kinds` (not a bool) or a one-element tensor's item(); else a
    failure, "{what} returned {its type}, expected {expected}"."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise fail(f"{what} returned {type(value).__name__}, expected {expected}")
    return value


def as_ids(value: Any, what: str) -> torch.Tensor:
    """The student's token ids (a list of ints, or a tensor of them) as a 1-D int64 tensor."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise fail(f"{what} returned {value!r:.80}, expected a list of int ids")
    return torch.tensor(list(value), dtype=torch.int64).reshape(-1)


def as_tensors(value: Any, names: tuple[str, ...], what: str) -> tuple[torch.Tensor, ...]:
    """Unpack a returned tuple such as (output, weights), each a tensor."""
    if not isinstance(value, tuple) or len(value) != len(names):
        got = f"a tuple of {len(value)}" if isinstance(value, tuple) else type(value).__name__
        raise fail(f"{what} must return a tuple ({', '.join(names)}), got {got}")
    return tuple(as_tensor(v, f"{what} ({name})") for v, name in zip(value, names, strict=True))


def as_text(value: Any, what: str) -> str:
    """The student's result, if it is a str; else a failure naming what it got."""
    if not isinstance(value, str):
        raise fail(f"{what} returned {type(value).__name__} {value!r:.60}, expected a str")
    return value


def describe_mask(mask: torch.Tensor) -> str:
    """An attention mask (B, T) as a call's messages name it: its values too, while it is small."""
    return f"attention_mask {fmt_shape(mask.shape)} = {mask.tolist()}" if mask.numel() <= 24 else \
        f"attention_mask {fmt_shape(mask.shape)}"


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _outputs(keys: str | tuple[str, ...], result: Any, what: str) -> dict[str, Any]:
    """{key: the tensor returned}, or for a tuple of keys {key: each tensor of the returned tuple}."""
    if isinstance(keys, str):
        return {keys: as_tensor(result, what)}
    return dict(zip(keys, as_tensors(result, keys, what), strict=True))


def returns(keys: str | tuple[str, ...], what: Callable[[dict[str, Any]], str], *args: str,
            **kwargs: str) -> Callable[[Any, dict[str, Any]], dict[str, Any]]:
    """A piece's `call` for a function of the case's inputs named `args` (and `kwargs`: parameter -> input name),
    tensors passed as copies, that returns a tensor ({keys: it}) or a tuple of them (one a key); `what(inputs)`
    names the call in messages. `what` runs in the graded kernel, whose view of a lab module keeps only what a
    case's `run` reaches (`package_view.py`): a lambda there may use builtins and `checks`, not the lab's own
    functions (a lab that needs one writes its `call` as a function)."""

    def call(fn: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        result = fn(*(_copy(inputs[a]) for a in args), **{k: _copy(inputs[v]) for k, v in kwargs.items()})
        return _outputs(keys, result, what(inputs))

    return call


def module_returns(keys: str | tuple[str, ...], what: Callable[[dict[str, Any]], str],
                   arg: str = "x") -> Callable[[Any, dict[str, Any]], dict[str, Any]]:
    """A piece's `call` for a module class: built with the case's `init` and `weights` (`build_module`), run on a
    copy of inputs[arg]; its outputs as `returns` gives them. `what(inputs)` names the module in messages."""

    def call(cls: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        name, x = what(inputs), inputs[arg]
        module = build_module(cls, name, inputs["init"], inputs["weights"])
        return _outputs(keys, module(x.clone()), f"{name} on {arg} {fmt_shape(x.shape)}")

    return call


def _student_frame(err: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the student's own code: not this package, not a library, not the standard library."""
    library = (_PACKAGE_DIR, sys.prefix, sys.base_prefix)
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith(library) and "site-packages" not in f.filename]
    return frames[-1] if frames else None


# torch's errors whose usual cause in these labs is known: (a pattern of the error's text, what to do)
LIKELY_CAUSES = (
    (r"~ \(operator\.invert\) is only implemented on integer and Boolean",
     "~ was applied to a float tensor: a mask must be torch.bool (True = may attend). Is it nanoGPT's float "
     "torch.tril(torch.ones(T, T))? Build it with dtype=torch.bool"),
    (r"masked_fill_? only supports boolean masks",
     "masked_fill's mask must be torch.bool, not a float tensor of 1.0 and 0.0: build it with dtype=torch.bool"),
)


def describe_error(err: BaseException) -> str:
    """"your code raised IndexError: ... (line 3 of your cell: `...`)", and the likely cause where the error is a
    known one (`LIKELY_CAUSES`)."""
    if isinstance(err, NotImplementedError):
        return "not written yet (your code raises NotImplementedError): replace `raise NotImplementedError()` with " \
               "your code"
    message = f"your code raised {type(err).__name__}: {err}".rstrip(": ")
    frame = _student_frame(err)
    if frame is not None and frame.line:
        message += f" (line {frame.lineno} of your cell: `{frame.line.strip()}`)"
    causes = [cause for pattern, cause in LIKELY_CAUSES if re.search(pattern, str(err))]
    return ". ".join([message, *causes[:1]])
