"""Solution cells that copy a lab's reference through routes that neither the source scan nor the kernel's identity
check follows (the package's file found from `check`, run with `exec` or `compile` fetched through pickle's
machinery, and a function rebuilt from a code object); the package view (gptcourse.grading.box.package_view) leaves
them a stub, so they earn nothing.

Plain data for the round trips of labs 02 and 10 (student -> ({solution cell grade_id: source}, failing tests)),
as in their WRONG tables; tests/test_grading_package_view.py tries the same routes in a bare kernel.
"""

from nbgrader_course import sandbox_problem

ROUTE = '''
import inspect, io, math, os, pickle, types
import torch
from torch.nn import functional as F
from gptcourse.grading import check

_file = os.path.join(os.path.dirname(os.path.dirname(inspect.getfile(check))), *{relative!r}.split("/"))
_machinery = pickle.Unpickler(io.BytesIO())
'''
SOURCE_EXEC = ROUTE + '''
_names = {{"__name__": "__main__", "__package__": {package!r}}}
try:
    _machinery.find_class("builtins", "exec")(open(_file).read(), _names)
except Exception:  # a lab module registers its cases twice: what it defined before that is there
    pass
{student} = _names[{name!r}]
'''
CODE_OBJECT = ROUTE + '''
_module = _machinery.find_class("builtins", "compile")(open(_file).read(), _file, "exec")
_code = next(c for c in _module.co_consts if getattr(c, "co_name", None) == {name!r})
_builtins = _machinery.find_class("builtins", "abs").__self__
{student} = types.FunctionType(_code, {{"__builtins__": _builtins, "math": math, "torch": torch, "F": F, {extra}}},
                               None, (None,) * _code.co_argcount)
'''
ROUTES = {
    "02_causal_attention": {
        "head-source-exec": ({"AttentionHead": SOURCE_EXEC.format(relative="model/causal_attention.py",
                                                         package="gptcourse.model", name="AttentionHead",
                                                         student="AttentionHead")},
                             {"test_AttentionHead", "test_AttentionHead_hidden"}),
        "attention-code-object": ({"attention": CODE_OBJECT.format(
            relative="model/causal_attention.py", name="attention", student="attention",
            extra='"causal_mask": lambda t, tk, device: causal_mask(t)')},
                                  {"test_attention", "test_attention_causal", "test_attention_hidden",
                                   "test_AttentionHead", "test_AttentionHead_hidden"}),
    },
    "10_finetuning_and_rewards": {
        "mask-reference-source": ({"padding_mask": SOURCE_EXEC.format(relative="model/causal_attention.py",
                                                                      package="gptcourse.model",
                                                                      name="padding_mask", student="padding_mask")},
                                  {"test_padding_mask", "test_padding_mask_left", "test_padding_mask_hidden"}),
        "bt-code-object": ({"bradley_terry_loss": CODE_OBJECT.format(
            relative="finetuning/losses.py", name="bradley_terry_loss", student="bradley_terry_loss", extra="")},
                           {"test_bradley_terry_loss", "test_bradley_terry_loss_large",
                            "test_bradley_terry_loss_hidden"}),
    },
}


def copied_references(lab: str) -> dict[str, tuple[dict[str, str], set[str]]]:
    """ROUTES[lab], where graded kernels run in the box (without it there is no package view, and the copies
    would earn their points: CI, which fails on a skip, always has the box)."""
    return ROUTES[lab] if sandbox_problem() is None else {}
