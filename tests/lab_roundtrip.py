"""The nbgrader round trip every lab's test module runs, written once.

A lab module subclasses `RoundTrip` as `class TestLabNN(RoundTrip)` and sets LAB (the lab's folder), WRONG
(student -> ({solution cell grade_id: what they wrote}, the test cells it must fail)), TOTAL (the lab's points)
and VALIDATE (a mistake, how many cells `nbgrader validate` must report, and what the report must say). One
autograde batch grades the solution, the untouched release and every mistake; lab-specific tests are methods
of the subclass and can use the same `scores`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from nbgrader_course import Course


@dataclass(frozen=True)
class Validation:
    student: str  # a key of WRONG
    failed_cells: int
    says: tuple[str, ...]  # snippets the validation report must contain


@pytest.mark.slow
class RoundTrip:
    LAB: str
    WRONG: dict[str, tuple[dict[str, str], set[str]]]
    TOTAL: int
    VALIDATE: Validation

    @pytest.fixture(scope="class")
    @classmethod
    def scores(cls, course: Course) -> dict[str, dict[str, float]]:
        return course.grade_class(cls.LAB, cls.WRONG)

    def test_solution_scores_full_marks(self, course: Course, scores: dict) -> None:
        assert scores["solution"] == course.expected_scores(self.LAB)
        assert sum(scores["solution"].values()) == self.TOTAL

    def test_untouched_release_scores_zero(self, course: Course, scores: dict) -> None:
        assert scores["untouched"] == course.expected_scores(self.LAB, set(course.expected_scores(self.LAB)))

    def test_each_mistake_loses_exactly_its_tests(self, course: Course, scores: dict) -> None:
        assert len(self.WRONG) >= 3
        got = {student: scores[student] for student in self.WRONG}
        assert got == {student: course.expected_scores(self.LAB, fails) for student, (_, fails) in self.WRONG.items()}

    def test_validate_reports_success_and_the_failing_test(self, course: Course) -> None:
        lab_number = self.LAB[:2]
        solved = course.validate(f"lab{lab_number}-solved", course.solved(self.LAB))
        assert "Success! Your notebook passes all the tests." in solved
        assert "WARNING" not in solved, f"validate printed a warning a student cannot act on:\n{solved[:2000]}"
        v = self.VALIDATE
        report = course.validate(f"lab{lab_number}-{v.student}", course.solved(self.LAB, self.WRONG[v.student][0]))
        assert f"VALIDATION FAILED ON {v.failed_cells} CELL(S)" in report
        for snippet in v.says:
            assert snippet in report
