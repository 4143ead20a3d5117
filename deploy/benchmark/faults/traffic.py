"""The fault run's clients: every planned request streamed through the public API with ``AsyncClient``.

Runs in its own process (``TrafficProcess``) so that hundreds of client streams do not share a GIL
with the router they measure: the router lives in the runner's process, and its availability probe
must see the router's own stalls, not the load generator's. Times are ``time.monotonic()``, which is
one clock for every process of the host, so the runner can lay them beside its kill times.
"""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

from deploy.local.launcher import REPO
from sdk import AsyncClient
from sdk.errors import BatonError
from sdk.retry import RetryPolicy

from .scenario import RequestPlan


@dataclass(frozen=True)
class RequestOutcome:
    """How one request ended, as its client saw it.

    ``status`` is the gRPC code name (``OK`` for a stream that ended with a finish reason;
    ``CANCELLED`` also when this client cancelled it). ``sent`` and ``ended`` (the last message or
    the error) are monotonic seconds; ``first_token`` is None when no token arrived.
    """

    request_id: str
    kind: str
    status: str
    finish_reason: str | None
    tokens: int
    sent: float
    first_token: float | None
    ended: float
    decode_worker: str  # from the final message's route: empty unless the stream finished
    prefill_worker: str  # its address; empty when decode prefilled the prompt itself
    detail: str = ""

    @property
    def seconds(self) -> float:
        """Time to final status: from sending to the last message or the error."""
        return self.ended - self.sent


class TrafficProcess:
    """Sends ``plans`` to the router at ``address``, ``concurrency`` at a time, in a child process
    (``main``: the plans go in on stdin as JSON, each outcome comes back on stdout as one JSON line
    as soon as its request ends).

    ``finished()`` counts the requests that have ended (the runner fires kills on it);
    ``outcomes()`` waits for the process and returns one ``RequestOutcome`` per plan, in plan order.
    """

    def __init__(self, address: str, plans: list[RequestPlan], concurrency: int, attempts: int):
        order = {plan.request_id: index for index, plan in enumerate(plans)}
        self._order = order
        self._received: list[RequestOutcome] = []
        search_path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from {__name__} import main; main()",
                address,
                str(concurrency),
                str(attempts),
            ],
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=search_path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._process.stdin.write(json.dumps([asdict(plan) for plan in plans]))
        self._process.stdin.close()
        self._reader = threading.Thread(target=self._read, name="fault-traffic", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._process.stdout:
            self._received.append(RequestOutcome(**json.loads(line)))

    def finished(self) -> int:
        """Requests that have ended so far."""
        return len(self._received)

    def outcomes(self, timeout_s: float) -> list[RequestOutcome]:
        """Every outcome, once all requests ended.

        Raises:
            TimeoutError: not done in ``timeout_s`` (the process is killed).
            RuntimeError: the process failed, or some request has no outcome.
        """
        try:
            code = self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise TimeoutError(f"the fault traffic did not finish in {timeout_s:.0f} s") from None
        self._reader.join(timeout=30)
        if code != 0 or len(self._received) != len(self._order):
            raise RuntimeError(
                f"the fault traffic exited with code {code} after {len(self._received)} of "
                f"{len(self._order)} outcomes"
            )
        return sorted(self._received, key=lambda outcome: self._order[outcome.request_id])

    def stop(self) -> None:
        """End the child process if it is still running."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)


async def _drive(address: str, plans: list[RequestPlan], concurrency: int, attempts: int) -> None:
    seats = asyncio.Semaphore(concurrency)
    async with AsyncClient(address, retry=RetryPolicy(max_attempts=attempts)) as client:

        async def one(plan: RequestPlan) -> None:
            async with seats:
                outcome = await _request(client, plan)
            print(json.dumps(asdict(outcome)), flush=True)

        await asyncio.gather(*(one(plan) for plan in plans))


async def _request(client: AsyncClient, plan: RequestPlan) -> RequestOutcome:
    """Stream one request; cancel it where its plan says. Never raises: the error is the outcome."""
    state = {"tokens": 0, "first": None, "final": None}
    sent = time.monotonic()

    async def consume() -> None:
        stream = client.generate_stream(
            prompt_ids=list(plan.prompt_ids),
            max_tokens=plan.max_tokens,
            ignore_eos=True,
            request_id=plan.request_id,
            timeout_s=plan.timeout_s,
        )
        try:
            async for chunk in stream:
                if chunk.token_ids and state["first"] is None:
                    state["first"] = time.monotonic()
                state["tokens"] += len(chunk.token_ids)
                if chunk.finish_reason is not None:
                    state["final"] = chunk
                elif plan.cancel_after_tokens is not None and state["tokens"] >= plan.cancel_after_tokens:
                    raise _ClientCancel
        finally:
            await stream.aclose()  # cancels the call on the server when it is still running

    status, detail = "OK", ""
    try:
        if plan.cancel_after_s is None:
            await consume()
        else:
            await asyncio.wait_for(consume(), plan.cancel_after_s)
    except (_ClientCancel, asyncio.TimeoutError):
        status = "CANCELLED"
    except BatonError as error:
        status, detail = error.code.name, error.details
    ended = time.monotonic()
    final = state["final"]
    if status == "OK" and final is None:
        status, detail = "NO_FINAL_MESSAGE", "the stream ended without a finish reason"
    route = final.route if final is not None and final.route is not None else None
    return RequestOutcome(
        request_id=plan.request_id,
        kind=plan.kind,
        status=status,
        finish_reason=final.finish_reason if final is not None else None,
        tokens=state["tokens"],
        sent=sent,
        first_token=state["first"],
        ended=ended,
        decode_worker=route.decode_worker if route else "",
        prefill_worker=route.prefill_worker if route else "",
        detail=detail,
    )


class _ClientCancel(Exception):
    """The plan's token count was reached: this client leaves the stream."""


def main() -> None:
    """The child process: ``ADDRESS CONCURRENCY ATTEMPTS`` as arguments, the plans on stdin."""
    address, concurrency, attempts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    plans = [
        RequestPlan(**{**plan, "prompt_ids": tuple(plan["prompt_ids"])}) for plan in json.load(sys.stdin)
    ]
    asyncio.run(_drive(address, plans, concurrency, attempts))
