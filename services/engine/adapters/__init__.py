"""LoRA adapters: PEFT's on-disk format, the one merge contract, a registry of loaded adapters, and the
per-step row grouping that applies each row's adapter inside the batch.

Modules (imported directly; this package file imports nothing so the model can use ``merge`` and
``step_lora`` without an import cycle through ``registry``):

- ``merge``: the merge contract, ``lora_output`` (serving and training call this one function).
- ``peft_format``: reads ``adapter_config.json`` + ``adapter_model.safetensors``.
- ``lora_adapter``: an adapter resolved against one model's modules, shapes validated.
- ``expert_lora``: the routed-expert loop with LoRA on gate, up and down.
- ``step_lora``: one step's rows grouped by adapter; what the layers call.
- ``registry``: the adapters an engine holds, by name, with load and unload.
"""
