"""Text in, ids out: tokenizers and the shipped offline corpus."""
