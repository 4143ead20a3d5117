"""The decode worker's rule for a handoff that arrived (``DecodeServicer._refusal``): decoded only when
every notification came from the sender the router named and the rows hash to the prefill worker's
checksum; a request from a router that sent neither is decoded as before. Each check is counted and
timed (``baton_handoff_checks_total``, ``baton_handoff_check_seconds_total``)."""

import pytest

from common.metrics import Metrics
from proto.baton.v1 import workers_pb2
from services.decode.servicer import DecodeServicer


class HashedRows:
    """The engine's side: the checksum of the rows that arrived (7), and what it was asked."""

    def __init__(self):
        self.asked = []

    def arrived_checksum(self, request_id, capability, with_draft):
        self.asked.append((request_id, capability, with_draft))
        return 7


@pytest.mark.parametrize(
    ("fields", "senders", "reason"),
    [
        (dict(handoff_sender="prefill-a", handoff_checksum=7), ["prefill-a"], None),
        (dict(handoff_sender="prefill-a", handoff_checksum=7), ["intruder"], "sender"),
        (dict(handoff_sender="prefill-a", handoff_checksum=7), ["prefill-a", "intruder"], "sender"),
        (dict(handoff_sender="prefill-a", handoff_checksum=8), ["prefill-a"], "checksum"),
        (dict(handoff_checksum=0), ["anyone"], "checksum"),  # 0 is a checksum too (field presence)
        (dict(), ["anyone"], None),  # a router that names neither: nothing to check
    ],
    ids=["honest", "other-sender", "second-sender", "checksum", "zero-checksum", "unchecked"],
)
def test_a_handoff_is_decoded_only_from_its_sender_with_its_checksum(fields, senders, reason):
    servicer = DecodeServicer.__new__(DecodeServicer)
    servicer.engine = HashedRows()
    servicer.metrics = Metrics("decode")
    request = workers_pb2.DecodeRequest(request_id="r1", draft_state=True, **fields)
    assert servicer._refusal(request, "cap", senders) == reason
    checked = "handoff_checksum" in fields and reason != "sender"
    assert servicer.engine.asked == ([("r1", "cap", True)] if checked else [])
    assert servicer.metrics.handoff_checks._value.get() == int(checked)  # counted, timed
    assert (servicer.metrics.handoff_check_seconds._value.get() > 0) == checked
