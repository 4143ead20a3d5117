"""GPU tests compare float32 runs with the float32 reference at 1e-4: Triton's float32 dots default to
TF32 (about 1e-3), and fla's KDA kernels take that default, so these tests ask for IEEE float32 dots
before any kernel compiles. (Our own kernels choose IEEE for float32 inputs themselves.)"""

import os

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")
