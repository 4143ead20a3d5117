"""Verify CUDA graphs (``--kda-rollback states``) on the CPU: the real ``DecodeGraphs`` (padding
sequences in the scratch block and slot, per-token KDA slots, the eligibility test, the runner's
choice) whose captured graphs are stood in for by an eager forward of the padded step it was given
(the CPU's reference kernels read the step's host fields, which a captured graph freezes), so the path
but the capture and its static buffers runs here. Greedy speculative decoding through it gives the plain
engine's tokens; verify steps of ``1 + k`` tokens replay the graph of their ``k`` and are padded to a
captured size. The captured side is ``tests/gpu/test_verify_graphs_gpu.py``."""

import pytest
import torch

from services.engine import LLM, engine_core
from services.engine.cuda_graphs import DecodeGraphs
from services.engine.model.backends.kernel_set import KernelSet
from tests.engine.scripted_proposer import Script, ScriptedProposer
from tests.engine.test_speculative_engine import ENGINE, GREEDY, PROMPTS, WRONG

K = 3


class _EagerGraph:
    """Stands in for one captured graph: ``replay`` runs the forward on the padded step last given."""

    def __init__(self, graphs: "EagerCapture", size: int):
        self.graphs, self.size = graphs, size

    def replay(self) -> None:
        graphs, graph = self.graphs, self.graphs.graphs[self.size]
        assert len(graphs.given) == self.size, "the step was not padded to the graph's size"
        meta = DecodeGraphs._metadata(graphs, graphs.given, None)
        graph.logits = graphs.model.forward_step(meta, graphs.cache)
        graphs.padded_steps.append(graphs.given)


class EagerCapture(DecodeGraphs):
    """``DecodeGraphs`` with eager stand-ins for the captured graphs; ``padded_steps``: each replay's."""

    def capture(self) -> None:
        self.padded_steps = []
        for size, graph in self.graphs.items():
            graph.graph = _EagerGraph(self, size)

    def _metadata(self, steps, out):
        self.given = steps
        return super()._metadata(steps, out)


@pytest.fixture(scope="module")
def plain(tiny_checkpoint):
    """The plain engine's greedy outputs (no graphs)."""
    return LLM(str(tiny_checkpoint("k3")), **ENGINE).generate(PROMPTS, GREEDY)


@pytest.fixture
def eager_graphs(monkeypatch):
    """Engines built here take graphs on the CPU: ``use_cuda_graphs`` says yes, the reference kernels
    count as capturable, and the capture is ``EagerCapture``'s."""
    monkeypatch.setattr(engine_core, "use_cuda_graphs", lambda *args, **kwargs: True)
    monkeypatch.setattr(engine_core, "DecodeGraphs", EagerCapture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(KernelSet, "forward_graph_safe", property(lambda self: True))


def test_verify_steps_replay_their_graph_and_give_plain_tokens(tiny_checkpoint, plain, eager_graphs):
    scripts = {
        tuple(o.prompt_ids): Script(tuple(o.token_ids), WRONG[p])
        for o, p in zip(plain, ("all", "none", "some"), strict=True)
    }
    llm = LLM(
        str(tiny_checkpoint("k3")),
        proposer=ScriptedProposer(K, scripts),
        **{**ENGINE, "spec_policy": "fixed"},
    )
    runner = llm.engine.runner
    assert sorted(runner.verify_graphs) == list(range(1, K + 1)) and runner.graphs is not None
    assert all(g.query_len == k + 1 for k, g in runner.verify_graphs.items())
    got = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    for g, w in zip(got, plain, strict=True):
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs, strict=True)) < 1e-4
    verify = runner.verify_graphs[K]
    assert verify.replays > 0, "no verify step replayed its graph"
    assert runner.graphs.replays > 0, "no decode step replayed its graph"
    # Three requests verify side by side, padded to the captured size 4 with a sequence of 1 + k tokens
    # in the scratch block and slot.
    padded = [steps for steps in verify.padded_steps if len(steps) == 4 and steps[-1] == verify.pad]
    assert padded and all(len(step.token_ids) == K + 1 for step in padded[0])
    assert verify.pad.slot == llm.engine.cache.slots.scratch_id and not verify.pad.draft_slots
    llm.engine.check_integrity()
    assert llm.engine.cache.slots.num_free == llm.engine.cache.slots.num_slots
