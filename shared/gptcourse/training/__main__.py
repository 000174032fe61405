"""`python -m gptcourse.training`: train lesson 07's recipe on a text file (see `gptcourse.training.loop.main`)."""

from .loop import main

main()
