"""Finetuning, lesson 10: padded batches, the losses of instruction tuning and reward modelling, LoRA, and the
small offline tasks the lesson finetunes on."""
