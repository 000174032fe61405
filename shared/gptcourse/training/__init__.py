"""Training, lesson 07 onwards: the loop, its recipe and its command line (`python -m gptcourse.training`)."""
