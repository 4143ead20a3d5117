"""The demo model shipped in the repository (issue 17): its corpus and tokenizer build."""
