"""nbgrader's steps: the plugins nbgrader_config.py names, one per file, in the order a submission meets them.

intake (collect, zip_collect and autograde admit a submission: collector, exporter, preprocessor), sanitize
(read tolerantly, restore cells), execute (run it in the box), judge (re-judge outside the kernel),
active_content (outputs as data), report (the grading report), feedback (hidden tests hidden). A step uses the
pieces and the box, never the classroom tools. Who changes it: whoever changes what autograde does to a notebook.
"""
