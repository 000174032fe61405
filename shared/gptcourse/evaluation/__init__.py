"""Evaluation, lesson 14: scoring continuations by log-likelihood, multiple choice (acc and acc_norm, few-shot
prompts), pass@k with a verifier, error bars, and the n-gram contamination check; the small generated tasks the
lesson evaluates on."""
