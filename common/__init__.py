"""What the router, SDK and workers share; never imports torch or the engine.

- ``errors.py``: ``NoCapacity`` and ``TransferError``, the failures that cross the process boundary.
- ``limits.py``: size limits on a request's fields, checked before any expensive work.
- ``sampling_params.py``: ``SamplingParams`` and its validation (``MAX_LOGPROBS``, the seed range).
- ``sampling_pb.py``: the ``SamplingParameters`` message read into ``SamplingParams``.
- ``stop_strings.py``: where a stop string ends a request's text.
- ``prefix_hash.py``: the SHA-256 block hash chain that keys the prefix cache.
- ``model_info.py``: what the router reads of a checkpoint's ``config.json`` (family, vocabulary size);
  ``config_fields.py``: the field-naming reader under it (the engine's config loader reads through both).
- ``tokenizer/``: the ``tokenizers``-backed tokenizer, chat templates, incremental detokenizer, tiny
  tokenizer builder.

``tests/common/test_torch_free.py`` holds this package to its rule.
"""
