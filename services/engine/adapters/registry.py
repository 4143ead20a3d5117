"""The adapters one engine serves, by name, each in a numbered slot that steps refer to.

Unload policy: **refused while in use**. ``EngineCore.unload_adapter`` raises ``AdapterInUse`` while
any unfinished request (waiting, running or reserved) names the adapter; the caller retries once they
finish (or aborts them). Nothing is deferred, so an unload either happened or did not when the call
returns, and a request's adapter cannot change under it. Slots are never reused, so a step built
before an unload can never pick up another adapter's weights.
"""

import re
from pathlib import Path

from torch import nn

from common.errors import InUse

from .lora_adapter import LoraAdapter, load_lora_adapter
from .peft_format import AdapterError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$")


class AdapterInUse(AdapterError, InUse):
    """An unload refused because unfinished requests use the adapter."""


class UnknownAdapter(AdapterError):
    """A request or call named an adapter that is not loaded."""


class AdapterRegistry:
    """Loaded adapters of one model.

    Args:
        model: the ``CausalLM`` the adapters attach to.
    """

    def __init__(self, model: nn.Module):
        self._model = model
        self._slots: dict[str, int] = {}
        self._table: dict[int, LoraAdapter] = {}
        self._next_slot = 1

    def load(self, name: str, folder: str | Path) -> LoraAdapter:
        """Read, validate and register an adapter under ``name``.

        Raises:
            AdapterError: a bad name, a name already loaded, or a bad folder (see ``load_lora_adapter``).
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise AdapterError(
                f"adapter: name {name!r} is not valid (1-128 of letters, digits and ._:/@-, "
                "starting with a letter or digit)"
            )
        if name in self._slots:
            raise AdapterError(f"adapter: {name!r} is already loaded (unload it first)")
        adapter = load_lora_adapter(name, folder, self._model)
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        self._slots[name] = slot
        self._table[slot] = adapter
        return adapter

    def remove(self, name: str) -> LoraAdapter:
        """Forget ``name`` (the engine checks it is unused first).

        Raises:
            UnknownAdapter: not loaded.
        """
        slot = self.slot(name)
        del self._slots[name]
        return self._table.pop(slot)

    def slot(self, name: str) -> int:
        """The slot of ``name``; 0 for ``""`` (the base model).

        Raises:
            UnknownAdapter: not loaded, naming the loaded ones.
        """
        if not name:
            return 0
        if name not in self._slots:
            loaded = ", ".join(sorted(self._slots)) or "none"
            raise UnknownAdapter(f"adapter: {name!r} is not loaded (loaded: {loaded})")
        return self._slots[name]

    def get(self, name: str) -> LoraAdapter:
        """The adapter loaded as ``name`` (raises ``UnknownAdapter``)."""
        return self._table[self.slot(name)]

    @property
    def names(self) -> list[str]:
        return sorted(self._slots)

    @property
    def table(self) -> dict[int, LoraAdapter]:
        """Slot -> adapter, what ``CausalLM.forward_step`` takes."""
        return self._table
