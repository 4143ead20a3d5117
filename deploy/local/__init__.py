"""The local cluster behind ``baton serve``: worker processes on this machine, supervised and restarted
when they die, each started from a ``WorkerConfig`` file, and the router in-process (``launcher.py``)."""
