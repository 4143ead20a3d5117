"""The engine shared by the prefill and decode services: model, checkpoints, tokenizer."""
