"""The box a graded kernel runs in: the isolation, and nothing else.

sandbox (the grader's half: bwrap's command line, limits, starting and resetting a box), confine (the half inside:
what the zygote does to each kernel it forks, the environment allowlist, the reset), zygote (the fork server),
memory_limit (a cgroup or a watchdog), package_view (the package without the lab's references). It uses the
pieces only for names they define (environment variables, the lab's forbidden references). Who changes it:
whoever changes what a student's code can see or do; docs/grading.md lists the tests that must fail first.
"""
