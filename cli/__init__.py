"""The ``baton`` command line: one module per subcommand, dispatched by ``cli.main``."""
