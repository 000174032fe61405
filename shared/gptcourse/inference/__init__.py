"""Generation, lesson 07 onwards: the KV cache and sampling."""
