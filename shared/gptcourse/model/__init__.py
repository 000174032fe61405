"""The network, lessons 01-06: configuration, positions, attention, norms, MLPs, the block, GPT, heads, parameter
counts and the Hugging Face bridge; and lesson 12's attention computed tile by tile (FlashAttention in PyTorch).
Import from `gptcourse`; the modules here say where each piece lives."""
