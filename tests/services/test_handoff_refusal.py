"""The decode worker's rule for a handoff that arrived (``DecodeServicer._await_parts`` then
``_refusal``): it waits for every part's notification (the last one with the handoff's tag), hashing
each part as it lands, and decodes only when every notification came from the sender the router named
and the parts' hashes add up to the prefill worker's checksum; a request from a router that sent
neither is decoded as before. Each check is counted and timed (``baton_handoff_checks_total``,
``baton_handoff_check_seconds_total``)."""

from concurrent.futures import Future

import pytest

from common.metrics import Metrics
from proto.baton.v1 import workers_pb2
from services.decode.servicer import DecodeServicer


class HashedParts:
    """The engine's side: the reservation's parts (their checksums, ``values``), and what it was asked."""

    def __init__(self, values):
        self.values, self.asked = values, []

    def arrived_parts(self, request_id, with_draft):
        self.asked.append((request_id, with_draft))
        return list(range(len(self.values)))

    def arrived_checksum(self, part, capability):
        self.asked.append((part, capability))
        future = Future()
        future.set_result(self.values[part])
        return future


class Inbox:
    """The transfer's side: which agents sent each notification, and the order they were awaited."""

    def __init__(self, senders):
        self.senders, self.awaited = senders, []

    def wait(self, tag, timeout_s):
        self.awaited.append(tag)
        return self.senders[tag]


class Live:
    def is_active(self):
        return True


@pytest.mark.parametrize(
    ("fields", "parts", "senders", "reason"),
    [
        (dict(handoff_sender="prefill-a", handoff_checksum=7), [7], ["prefill-a"], None),
        (dict(handoff_sender="prefill-a", handoff_checksum=7, handoff_parts=2), [3, 4], ["prefill-a"], None),
        (dict(handoff_sender="prefill-a", handoff_checksum=7), [7], ["intruder"], "sender"),
        (dict(handoff_sender="prefill-a", handoff_checksum=7), [7], ["prefill-a", "intruder"], "sender"),
        (
            dict(handoff_sender="prefill-a", handoff_checksum=8, handoff_parts=2),
            [3, 4],
            ["prefill-a"],
            "checksum",
        ),
        (dict(handoff_checksum=0), [0], ["anyone"], None),  # 0 is a checksum too (field presence)
        (dict(handoff_checksum=7, handoff_parts=2), [7], ["anyone"], "checksum"),  # here: one part
        (dict(), [7], ["anyone"], None),  # a router that names neither: nothing to check
    ],
    ids=["honest", "two-parts", "other-sender", "second-sender", "checksum", "zero", "unsplit", "unchecked"],
)
def test_a_handoff_is_decoded_only_from_its_sender_with_its_checksum(fields, parts, senders, reason):
    count = max(1, fields.get("handoff_parts", 0))
    tags = [f"r1/cap#{part}" for part in range(count - 1)] + ["r1/cap"]
    servicer = DecodeServicer.__new__(DecodeServicer)
    servicer.engine, servicer.transfer = HashedParts(parts), Inbox(dict.fromkeys(tags, senders))
    servicer.metrics, servicer.transfer_timeout_s = Metrics("decode"), 5.0
    request = workers_pb2.DecodeRequest(request_id="r1", draft_state=True, **fields)
    arrived = servicer._await_parts(request, "cap", Live())
    assert servicer.transfer.awaited == tags  # every part, the handoff's own tag last
    assert servicer._refusal(request, *arrived) == reason
    hashed = "handoff_checksum" in fields
    split = len(parts) == count  # the rows here split as the sender's: each part hashed as it landed
    hashes = [(part, "cap") for part in range(count)] if split else []
    assert servicer.engine.asked == ([("r1", True), *hashes] if hashed else [])
    checked = hashed and reason != "sender"
    assert servicer.metrics.handoff_checks._value.get() == int(checked)  # counted, timed
    assert (servicer.metrics.handoff_check_seconds._value.get() > 0) == checked
