"""A token bitmask applied to logits rows (structured output): ``naive.py`` the reference, ``batched.py``
the device form; bitwise equal."""
