"""The NIXL transfer backend: one-sided WRITEs between registered host or GPU pools (UCX plugin).

One NIXL agent per backend object. Regions are registered with their memory type (``DRAM`` for
host tensors, ``VRAM`` for CUDA tensors), so the same code serves the CPU tests and the GPU cluster.
A write (or a read) is one NIXL transfer request per (local, remote) memory-type pair -- in practice
one -- with one descriptor per coalesced run of rows (or per byte span of ``write_bytes``); a write's
request id rides on it as the NIXL notification, which the receiver gets only after the data has
landed.
"""

import logging
import threading
import time
import uuid

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config

from common.errors import TransferError

from .backend import Notification, TransferBackend
from .byte_plan import ByteSpan
from .endpoint import RegionInfo, TransferEndpoint

log = logging.getLogger(__name__)

# Busy-poll this many times before sleeping between polls: small writes finish in microseconds.
_SPIN_POLLS = 2000
_POLL_SLEEP_S = 1e-4
_PROGRESS_INTERVAL_S = 1e-3  # how often the idle agent is progressed (incoming writes, notifications)


class NixlBackend(TransferBackend):
    """Transfer backend on a NIXL agent.

    Args:
        agent_name: unique name of this agent in the cluster (default: ``baton-<random>``).
        plugin: the NIXL transport plugin to instantiate (``"UCX"``).
    """

    name = "nixl"

    def __init__(self, agent_name: str | None = None, plugin: str = "UCX"):
        super().__init__(agent_name or f"baton-{uuid.uuid4().hex[:12]}")
        # Metadata travels over Baton's gRPC, so NIXL's own listener (a fixed port) stays off. NIXL's
        # own progress thread busy-polls a whole core even when idle (its Python API fixes the
        # delay at 0), so it stays off too: a sender progresses while it polls its write's state,
        # and this backend's progress thread wakes every millisecond for incoming work. The agent
        # is not thread-safe in this mode: every call into it holds ``_agent_lock``, one call at a
        # time (never across a write's wait, so writes from several threads proceed in parallel).
        config = nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False, backends=[plugin])
        try:
            self._agent = nixl_agent(self.agent_name, config)
        except Exception as exc:
            raise TransferError(f"nixl: creating agent {self.agent_name!r} failed: {exc}") from exc
        if plugin not in self._agent.backends:
            raise TransferError(
                f"nixl: plugin {plugin!r} is not available (found {self._agent.get_plugin_list()})"
            )
        self._reg_descs: dict[str, object] = {}
        self._agent_lock = threading.Lock()
        self._arrived: list[Notification] = []  # collected by the progress thread, not yet polled
        self._stop_progress = threading.Event()
        self._progress = threading.Thread(target=self._progress_loop, name="nixl-progress", daemon=True)
        self._progress.start()

    def _progress_loop(self) -> None:
        while not self._stop_progress.wait(_PROGRESS_INTERVAL_S):
            with self._agent_lock:
                if self._agent is None:
                    return
                try:
                    self._arrived.extend(self._new_notifications())
                except Exception as exc:  # reported, never fatal: the next poll tries again
                    log.warning("nixl: progressing agent %r failed: %s", self.agent_name, exc)

    def _register_region(self, info: RegionInfo) -> None:
        descs = [(info.base_addr, info.nbytes, info.device_id, "")]
        with self._agent_lock:
            self._reg_descs[info.name] = self._agent.register_memory(descs, info.mem_type)

    def _metadata(self) -> bytes:
        with self._agent_lock:
            return self._agent.get_agent_metadata()

    def _add_peer(self, endpoint: TransferEndpoint) -> None:
        with self._agent_lock:
            loaded = self._agent.add_remote_agent(endpoint.metadata)
            loaded = loaded.decode() if isinstance(loaded, bytes) else loaded
            if loaded != endpoint.agent_name:
                self._agent.remove_remote_agent(loaded)
                raise TransferError(
                    f"nixl: endpoint names agent {endpoint.agent_name!r} but its metadata is {loaded!r}"
                )

    def _remove_peer(self, peer: str) -> None:
        with self._agent_lock:
            self._agent.remove_remote_agent(peer)

    def _write_spans(
        self, endpoint: TransferEndpoint, spans: list[ByteSpan], message: str | None, deadline: float
    ) -> None:
        # The notification must follow *all* the data: ride on the request when there is one,
        # else send it separately once every request is done.
        groups = self._descriptors(endpoint, spans)
        inline = message.encode() if message is not None and len(groups) == 1 else b""
        self._transfer("WRITE", "write to", endpoint.agent_name, groups, deadline, inline)
        if message is not None and not inline:
            with self._agent_lock:
                self._agent.send_notif(endpoint.agent_name, message.encode())

    def _read_spans(self, endpoint: TransferEndpoint, spans: list[ByteSpan], deadline: float) -> None:
        self._transfer("READ", "read from", endpoint.agent_name, self._descriptors(endpoint, spans), deadline)

    def _transfer(
        self, operation: str, phrase: str, peer: str, groups: dict, deadline: float, notif: bytes = b""
    ) -> None:
        """Post one ``operation`` (``WRITE`` / ``READ``) request per memory-type pair of ``groups``, wait
        for all of them, release every handle; ``phrase`` names it in errors (``write to``)."""
        handles = []
        try:
            for (local_mem, remote_mem), (local, remote) in groups.items():
                with self._agent_lock:
                    handle = self._agent.initialize_xfer(
                        operation,
                        self._agent.get_xfer_descs(local, local_mem),
                        self._agent.get_xfer_descs(remote, remote_mem),
                        peer,
                        notif,
                    )
                    handles.append(handle)
                    posted = self._agent.transfer(handle)
                if posted == "ERR":
                    raise TransferError(f"nixl: posting the {phrase} peer {peer!r} failed")
            self._wait(handles, peer, deadline, phrase)
        finally:
            for handle in handles:
                try:
                    with self._agent_lock:
                        self._agent.release_xfer_handle(handle)
                except Exception as exc:  # an aborted in-flight request; NIXL keeps it for later
                    log.warning("nixl: releasing a %s %r failed: %s", phrase, peer, exc)

    def _descriptors(
        self, endpoint: TransferEndpoint, spans: list[ByteSpan]
    ) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
        """``(local mem type, remote mem type) -> (local, remote)`` ``[n, 3]`` uint64 descriptor
        arrays of ``(address, bytes, device id)``, one row per span."""
        rows: dict[tuple[str, str], tuple[list, list]] = {}
        for span in spans:
            local, remote = self._regions[span.local_region], endpoint.region(span.remote_region)
            local_list, remote_list = rows.setdefault((local.mem_type, remote.mem_type), ([], []))
            local_list.append((local.base_addr + span.local_offset, span.nbytes, local.device_id))
            remote_list.append((remote.base_addr + span.remote_offset, span.nbytes, remote.device_id))
        return {
            key: (np.array(local, dtype=np.uint64), np.array(remote, dtype=np.uint64))
            for key, (local, remote) in rows.items()
        }

    def _wait(self, handles: list, peer: str, deadline: float, operation: str = "write to") -> None:
        """Poll the posted ``handles`` until all are done; the agent lock only around each check."""
        pending, polls = list(handles), 0
        while pending:
            still = []
            for handle in pending:
                with self._agent_lock:
                    state = self._agent.check_xfer_state(handle)
                if state == "ERR":
                    raise TransferError(f"nixl: the {operation} peer {peer!r} failed (transfer state ERR)")
                if state != "DONE":
                    still.append(handle)
            pending = still
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise TransferError(
                    f"nixl: the {operation} peer {peer!r} did not complete before its timeout"
                )
            polls += 1
            if polls > _SPIN_POLLS:
                time.sleep(_POLL_SLEEP_S)

    def _poll(self) -> list[Notification]:
        with self._agent_lock:
            arrived, self._arrived = self._arrived + self._new_notifications(), []
        return arrived

    def _new_notifications(self) -> list[Notification]:
        notifs = self._agent.get_new_notifs()
        return [
            Notification(peer.decode() if isinstance(peer, bytes) else peer, message.decode())
            for peer, messages in notifs.items()
            for message in messages
        ]

    def _close(self) -> None:
        self._stop_progress.set()  # it exits at its next wake-up: the agent is gone by then
        with self._agent_lock:
            for region, descs in self._reg_descs.items():
                try:
                    self._agent.deregister_memory(descs)
                except Exception as exc:
                    log.warning("nixl: deregistering region %r failed: %s", region, exc)
            self._reg_descs.clear()
            self._agent = None
