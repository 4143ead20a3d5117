"""The launcher's ``Supervisor`` restarts what died together in waves: the node's tier (wave 0) is ready
before any worker starts, and the workers of one wave start at once (their starts overlap), so two
workers that died together cost one start's time. Processes here are stand-ins whose ``start`` only
records when it ran: the subject is the supervisor's ordering, not a subprocess."""

import threading
import time

from deploy.local.managed_process import ManagedCache, ManagedProcess
from deploy.local.supervisor import Supervisor

START_S = 0.3


class StandIn(ManagedProcess):
    """Dead until started; ``start`` takes ``START_S`` and logs (name, began, ended)."""

    grace_period_s = 0.0

    def __init__(self, name: str, log: list, wave: int | None = None):
        super().__init__(port=1)
        self.name = name
        self.log = log
        if wave is not None:
            self.restart_wave = wave
        self.up = threading.Event()

    def alive(self) -> bool:
        return self.up.is_set()

    def start(self, ready_timeout_s: float) -> None:
        began = time.monotonic()
        time.sleep(START_S)
        self.log.append((self.name, began, time.monotonic()))
        self.up.set()


def test_the_tier_comes_back_first_then_the_workers_at_once():
    log = []
    tier = StandIn("cache", log, wave=ManagedCache.restart_wave)
    prefill, decode = StandIn("prefill-0", log), StandIn("decode-0", log)
    supervisor = Supervisor([prefill, tier, decode], ready_timeout_s=5, interval_s=0.01)
    supervisor.start()
    try:
        deadline = time.monotonic() + 10
        while len(log) < 3:
            assert time.monotonic() < deadline, log
            time.sleep(0.01)
    finally:
        supervisor.stop()
    spans = {name: (began, ended) for name, began, ended in log}
    assert ManagedCache.restart_wave < ManagedProcess.restart_wave
    assert spans["cache"][1] <= min(spans["prefill-0"][0], spans["decode-0"][0])  # tier ready first
    (p_began, p_ended), (d_began, d_ended) = spans["prefill-0"], spans["decode-0"]
    assert p_began < d_ended and d_began < p_ended  # the two workers' starts overlapped
    assert (tier.restarts, prefill.restarts, decode.restarts) == (1, 1, 1)
