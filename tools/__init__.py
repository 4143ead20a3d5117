"""Project tools that are not part of the serving stack: the demo model's corpus and tokenizer."""
