"""Training a LoRA adapter with the trainer forward: its A/B as parameters, and written back as a PEFT folder.

```python
adapter = load_lora_adapter("policy", folder, model)       # or llm.engine.adapters.get("policy")
params = trainable_adapter(adapter)                         # [A, B, A, B, ...], requires_grad
batch = PackedBatch.pack([Trajectory(prompt, output, adapter="policy"), ...])
result = trajectory_logprobs(model, batch, adapters={"policy": adapter})
loss.backward(); optimizer.step()                           # e.g. torch.optim.SGD(params, lr)
save_adapter(adapter, new_folder)                           # then serve it: --adapters policy=new_folder
```

The tensors are the adapter's own (``LoraAdapter.pairs``: float32, on the model's device), so an engine
serving the same ``LoraAdapter`` object sees an update at once; another process sees it once the folder
is written and loaded. Written tensors are float32 (the adapter's training dtype; a bfloat16 folder
widens exactly on load, so the first write-back changes no served bit).
"""

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from services.engine.adapters.lora_adapter import LoraAdapter
from services.engine.adapters.peft_format import CONFIG_FILE, WEIGHTS_FILE


def trainable_adapter(adapter: LoraAdapter) -> list[torch.Tensor]:
    """Turn gradients on for every A and B of ``adapter`` and return them, ordered by module name then
    A before B: the parameters to hand an optimizer. The base model's parameters are left as they are
    (``model.requires_grad_(False)`` trains the adapter alone)."""
    tensors = []
    for module in sorted(adapter.pairs):
        pair = adapter.pairs[module]
        tensors += [pair.a.requires_grad_(True), pair.b.requires_grad_(True)]
    return tensors


def save_adapter(adapter: LoraAdapter, folder: str | Path) -> Path:
    """Write ``adapter``'s current A/B as a PEFT LoRA folder (``docs/adapters.md``): the
    ``adapter_config.json`` it was loaded with, and ``adapter_model.safetensors`` in float32.

    Returns:
        the folder (created if needed).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(adapter.path) / CONFIG_FILE
    if source.resolve() != (folder / CONFIG_FILE).resolve():
        shutil.copyfile(source, folder / CONFIG_FILE)
    tensors = {}
    for module, pair in adapter.pairs.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = pair.a.detach().cpu().contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = pair.b.detach().cpu().contiguous()
    save_file(tensors, str(folder / WEIGHTS_FILE))
    return folder
