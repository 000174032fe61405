"""A synthetic class of lab 02 for the class report's tests: what was planted (each student's failing cases, with
their outcomes and mistake keys), the lab's cells and points, and a course folder holding the class as autograde
leaves it (`bench_class_report.write_autograded`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from gptcourse.grading.classroom.bench_class_report import write_autograded

ROOT = Path(__file__).resolve().parents[1]
LAB = "02_causal_attention"
HOSTILE = ["=HYPERLINK(\"x\")", "<img src=x onerror=alert(1)>", "+1-1", "@SUM(1)", "-2", "\tx"]
# Lab 02's test cells and points, from its solution notebook: each case's cell, in order
CELLS = {"test_causal_mask": (2, ["02.causal_mask.visible"]),
         "test_causal_mask_hidden": (1, ["02.causal_mask.hidden_single", "02.causal_mask.hidden_sizes"]),
         "test_attention": (3, ["02.attention.visible"]), "test_attention_causal": (2, ["02.attention.causal"]),
         "test_attention_hidden": (2, ["02.attention.hidden_single", "02.attention.hidden_heads"]),
         "test_AttentionHead": (3, ["02.AttentionHead.visible"]),
         "test_AttentionHead_hidden": (2, ["02.AttentionHead.hidden_single", "02.AttentionHead.hidden_square",
                                           "02.AttentionHead.hidden_sizes"])}
WRONG = ("wrong", None)
# student -> {case: (outcome, mistake)}: what was planted, with keys lab 02's grader gives
PLANTED = {
    "ok-1": {}, "ok-2": {},
    "unscaled-1": dict.fromkeys(["02.attention.visible", "02.attention.hidden_heads"], ("wrong", "attention.unscaled")),
    "unscaled-2": dict.fromkeys(["02.attention.visible", "02.AttentionHead.visible"], ("wrong", "attention.unscaled")),
    "unscaled-3": {"02.attention.visible": ("wrong", "attention.unscaled")},
    "triangle-1": {"02.causal_mask.visible": ("wrong", "mask.wrong_triangle")},
    "triangle-2": {"02.causal_mask.visible": ("wrong", "mask.wrong_triangle"),
                   "02.causal_mask.hidden_single": ("wrong", "mask.wrong_triangle")},
    # passed every visible case of attention, failed a hidden one: 2 students (one raised, one unnamed)
    "heads-1": {"02.attention.hidden_heads": ("error", None)},
    "heads-2": {"02.attention.hidden_single": WRONG},
    # of AttentionHead: 1 student, whose hidden mistake is named
    "square-1": {"02.AttentionHead.hidden_square": ("wrong", "02.no_value_projection")},
    # two mistakes named in one piece: counted for the first (visible) only
    "swapped-1": {"02.AttentionHead.visible": ("wrong", "attention.swapped"),
                  "02.AttentionHead.hidden_single": ("wrong", "attention.unscaled")},
    **{name: {"02.causal_mask.hidden_sizes": WRONG} for name in HOSTILE},
}
STOPPED = {"stopped-1": ("the kernel was restarted 3 times: the remaining cells were not run",)}


def score(failing: dict) -> float:
    """Lab 02's points for a student failing `failing`'s cases, from CELLS (all or nothing per cell)."""
    return sum(points for points, cases in CELLS.values() if not set(cases) & set(failing))


def course_with(tmp: Path, planted: dict, stopped: dict = STOPPED) -> Path:
    root = tmp / "course"
    for folder in ("labs", "solutions"):
        shutil.copytree(ROOT / folder / LAB, root / folder / LAB)
    (root / "lessons").mkdir()
    shutil.copy(ROOT / "lessons" / f"{LAB}.ipynb", root / "lessons")
    for student, failing in planted.items():
        write_autograded(root, LAB, student, failing)
    for student, lines in stopped.items():
        write_autograded(root, LAB, student, dict.fromkeys(CELLS["test_attention"][1] + CELLS["test_AttentionHead"][1],
                                                           ("not_run", None)), lines)
    (root / "grading" / "submitted" / "never-graded" / LAB).mkdir(parents=True)
    return root
