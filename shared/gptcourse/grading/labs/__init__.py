"""One module per lab, each registering its cases with `gptcourse.grading.cases.register`; all are imported on
the first case lookup, so adding a lab is adding a module here."""
