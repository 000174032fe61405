"""The instructor's tools around nbgrader: a class graded at once, on one machine or a cluster, and what follows.

grade_one (one submission through nbgrader, as every path grades it), batch (`gptcourse autograde`), cluster
(`--cluster`), similarity (`gptcourse similarity`), archives and csv_export (nbgrader's zip_collect and export
plugins: they bound an LMS's archives and keep formulas out of grades.csv), throwaway_postgres, and the benchmarks
(bench_grading, bench_similarity). Nothing below imports them. Who changes it: whoever changes how a class is
graded or checked, not what a submission's grade is (that is the steps and the pieces).
"""
