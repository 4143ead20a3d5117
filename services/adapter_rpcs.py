"""The LoRA adapter RPCs both worker services share (``LoadAdapter``, ``UnloadAdapter``, ``ListAdapters``).

Thin: each is one ``EngineService`` call, run between engine steps. A bad name or folder is
INVALID_ARGUMENT naming the field or tensor; an unload while a request uses the adapter is
FAILED_PRECONDITION (``AdapterInUse``; nothing changes, retry once it finishes). The new list reaches
the router with the worker's next load update (``WorkerStats.adapters``).
"""

from services.rpc.convert import adapters_to_pb


class AdapterRpcs:
    """Mixed into a worker servicer that has ``self.engine`` (an ``EngineService``)."""

    def LoadAdapter(self, request, context):
        if not request.name:
            raise ValueError("name: required")
        if not request.path:
            raise ValueError("path: required (a PEFT LoRA folder on the worker)")
        return adapters_to_pb(self.engine.load_adapter(request.name, request.path))

    def UnloadAdapter(self, request, context):
        if not request.name:
            raise ValueError("name: required")
        return adapters_to_pb(self.engine.unload_adapter(request.name))

    def ListAdapters(self, request, context):
        return adapters_to_pb(self.engine.adapters())
