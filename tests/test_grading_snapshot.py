"""Every verdict and message of a lab's grading equals the committed snapshot (tests/grading_snapshot.py): the
solution, the known mistakes and the blind students of its round trip, every case, in-process. A change to the
grading that changes a score or a message shows here; rewrite the snapshot (`python tests/grading_snapshot.py write
NN`) only for a message that got better, and say so in the commit.

CI compares lab 02 alone (about 15 s): the whole course takes minutes. Before and after a change to the grading
run `python tests/grading_snapshot.py diff` (every lab), or set GPTCOURSE_SNAPSHOT_LABS="01 02 ... 16" here."""

from __future__ import annotations

import os

import pytest
from grading_snapshot import differences, lab_rows, read, stable

LABS = os.environ.get("GPTCOURSE_SNAPSHOT_LABS", "02").split()


@pytest.mark.parametrize("lab", LABS)
def test_every_verdict_and_message_is_the_snapshots(lab, monkeypatch):
    monkeypatch.delenv("GPTCOURSE_SECRET", raising=False)
    found = differences(read([lab]), lab_rows(lab))
    assert not found, "\n".join(found[:20])


def test_a_changed_message_or_score_is_a_difference():
    row = {"lab": "99", "student": "s", "case": "99.p.visible", "passed": False, "points": 0.0,
           "message": "the output: largest error 3.1e-07 at (0, 2), 4 of 12 entries off."}
    assert differences([row], [row | {"message": row["message"].replace("3.1e-07", "2.9e-07")}]) == []
    assert differences([row], [row | {"message": row["message"].replace("(0, 2)", "(0, 3)")}])
    assert differences([row], [row | {"passed": True}])
    assert differences([row], [row | {"points": 1.0}])
    assert differences([row], [])
    assert stable("x 0.25, 1e-5, -3.5E+02 and 12 (3, 4)") == "x #, #, # and 12 (3, 4)"
