"""Plain float32 PyTorch references for every kernel Baton runs (the flash-linear-attention habit).

Each sub-package is one op: ``naive.py`` is the readable reference with shapes in its docstrings;
faster forms (``chunk.py``, Triton kernels later) keep the same signature and are tested against it.
"""
