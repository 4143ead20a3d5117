"""The prefill worker: computes a prompt's cache state and writes it into a decode worker's memory."""
