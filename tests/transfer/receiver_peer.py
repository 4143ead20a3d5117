"""A decode-side receiver in its own process, driven over a pipe by the test (the sender).

``ReceiverPeer`` spawns it and sends commands; every reply wait is bounded, and ``close`` always
ends the process (stop, then kill).
"""

import multiprocessing

import numpy as np
import torch

from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import Layout
from services.engine.cache.state_pool import StateSlotPool
from services.transfer import BLOCKS, STATE, make_backend

# Deliberately not powers of two, so a wrong stride shows.
NUM_BLOCKS, BLOCK_BYTES, BLOCK_SIZE = 13, 192, 4
NUM_SLOTS, SLOT_BYTES = 3, 1088
REPLY_TIMEOUT_S = 30.0


def make_pools() -> tuple[BlockPool, StateSlotPool]:
    """A block pool and a slot pool with raw byte layouts (the transfer sees only bytes)."""
    blocks = BlockPool(Layout((), BLOCK_BYTES), BLOCK_SIZE, NUM_BLOCKS, device="cpu")
    slots = StateSlotPool(Layout((), SLOT_BYTES), NUM_SLOTS, device="cpu")
    return blocks, slots


def sentinel(shape: tuple[int, int], salt: int) -> torch.Tensor:
    """A position-dependent byte pattern: any misplaced or stray write changes it."""
    index = torch.arange(shape[0] * shape[1], dtype=torch.int64).view(shape)
    return ((index * 131 + salt * 17 + 7) % 251).to(torch.uint8)


def _serve(conn, backend_name: str, agent_name: str) -> None:
    blocks, slots = make_pools()
    backend = make_backend(backend_name, agent_name)
    backend.register(BLOCKS, blocks.storage)
    backend.register(STATE, slots.storage)

    def fill() -> None:
        blocks.storage.copy_(sentinel(tuple(blocks.storage.shape), 1))
        slots.storage.copy_(sentinel(tuple(slots.storage.shape), 2))

    def snapshot() -> tuple[np.ndarray, np.ndarray]:
        return blocks.storage.numpy().copy(), slots.storage.numpy().copy()

    handlers = {
        "endpoint": backend.endpoint,
        "fill": fill,
        "snapshot": snapshot,
        "wait": backend.wait_notification,
        "poll": backend.poll_notifications,
    }
    while conn.poll(REPLY_TIMEOUT_S * 10):  # the parent's EOF or silence ends the loop too
        command, *args = conn.recv()
        if command == "stop":
            break
        try:
            conn.send(("ok", handlers[command](*args)))
        except Exception as exc:
            conn.send(("error", exc))
    backend.close()
    conn.close()


class ReceiverPeer:
    """Handle on a spawned receiver process owning a block pool and a slot pool."""

    def __init__(self, backend_name: str = "nixl", agent_name: str = "decode-test"):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, backend_name, agent_name), daemon=True)
        self.process.start()
        child.close()

    def call(self, command: str, *args, timeout_s: float = REPLY_TIMEOUT_S):
        self._conn.send((command, *args))
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"receiver did not answer {command!r} within {timeout_s} s")
        status, value = self._conn.recv()
        if status == "error":
            raise value
        return value

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        return self.call("snapshot")

    def kill(self) -> None:
        """End the process abruptly (a dead peer), without a clean shutdown."""
        self.process.kill()
        self.process.join(10)

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        self._conn.close()
