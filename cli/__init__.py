"""The ``baton`` command line: one module per subcommand, dispatched by ``cli.main``."""

from kernels.invariant.reproducible_blas import request_strict_mkl

request_strict_mkl()  # before any matrix product runs in this process or the workers it starts
