"""LoRA adapters over real worker processes: an adapter loaded at start (``--adapters``) and one loaded
while serving (``LoadAdapter``), requests through the router with ``adapter`` or ``model`` naming one
(handed off prefill -> decode, and prefilled locally) equal the offline engine with that adapter;
unknown adapters are INVALID_ARGUMENT naming the field; ListModels lists the adapters; unload is
refused while in use and otherwise takes effect."""

import time
from typing import NamedTuple

import grpc
import pytest

from cli.main import main as baton
from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from services.engine import LLM, SamplingParams
from tests.lora_adapters import random_pairs, write_peft_adapter
from tests.services.routers import router_factory
from tests.services.workers import WorkerProcess, running_workers

PROMPT = [(7 * i) % 97 + 1 for i in range(40)]
RANK, ALPHA = 4, 8.0


class Cluster(NamedTuple):
    model: object
    prefill: WorkerProcess
    decode: WorkerProcess
    folders: dict
    offline: LLM


@pytest.fixture(scope="module")
def cluster(tiny_checkpoint, tmp_path_factory):
    model = tiny_checkpoint("k3")
    folders = {
        name: str(
            write_peft_adapter(tmp_path_factory.mktemp(name), random_pairs(model, RANK, seed), RANK, ALPHA)
        )
        for seed, name in ((1, "alpha"), (2, "beta"))
    }
    flags = ("--dtype", "float32", "--adapters", f"alpha={folders['alpha']}")
    with running_workers(model, ("prefill", *flags), ("decode", *flags)) as (prefill, decode):
        offline = LLM(str(model), dtype="float32")
        for name, folder in folders.items():
            offline.load_adapter(name, folder)
        yield Cluster(model, prefill, decode, folders, offline)


@pytest.fixture
def router_over(cluster):
    with router_factory(cluster.model) as make:
        yield make


def generate(stub, prompt, max_tokens=6, **fields):
    sampling = generation_pb2.SamplingParameters(max_tokens=max_tokens, ignore_eos=True)
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt), sampling=sampling, **fields
    )
    messages = list(stub.Generate(request, timeout=120))
    return [t for m in messages for t in m.token_ids], messages[-1]


def offline(cluster, adapter, max_tokens=6):
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return cluster.offline.generate([PROMPT], params, adapter=adapter)[0].token_ids


def stubs(cluster):
    decode = workers_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(cluster.decode.address))
    prefill = workers_pb2_grpc.PrefillWorkerStub(grpc.insecure_channel(cluster.prefill.address))
    return prefill, decode


def wait_for_models(stub, want: set[str]) -> list:
    deadline = time.monotonic() + 30
    while True:
        models = stub.ListModels(generation_pb2.ListModelsRequest(), timeout=10).models
        if {m.id for m in models if m.parent} == want or time.monotonic() > deadline:
            return models
        time.sleep(0.1)


@pytest.mark.parametrize("local_prefill_tokens", [0, 1000], ids=["handoff", "local-prefill"])
def test_a_request_with_an_adapter_equals_the_offline_engine(cluster, router_over, local_prefill_tokens):
    router = router_over([cluster.prefill], [cluster.decode], local_prefill_tokens=local_prefill_tokens)
    wait_for_models(router.stub, {"alpha"})
    want = offline(cluster, "alpha")
    assert want != offline(cluster, ""), "the adapter changes nothing: the comparison would be vacuous"
    tokens, final = generate(router.stub, PROMPT, adapter="alpha")
    assert tokens == want
    assert (final.route.transfer_backend == "nixl") == (local_prefill_tokens == 0)
    assert generate(router.stub, PROMPT, model="alpha")[0] == want  # the OpenAI front's way
    assert generate(router.stub, PROMPT)[0] == offline(cluster, "")


def test_unknown_adapters_are_invalid_arguments_naming_the_field(cluster, router_over):
    router = router_over([cluster.prefill], [cluster.decode])
    wait_for_models(router.stub, {"alpha"})
    for fields, field in (({"adapter": "nope"}, "adapter"), ({"model": "nope"}, "model")):
        with pytest.raises(grpc.RpcError) as caught:
            generate(router.stub, PROMPT, **fields)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details().startswith(f"{field}: 'nope' is not")
    # A worker asked directly (the router's view can lag a moment) refuses the same way.
    _, decode = stubs(cluster)
    local = workers_pb2.LocalPrefill(prompt_ids=PROMPT, adapter="nope")
    local.sampling.max_tokens = 2
    with pytest.raises(grpc.RpcError) as caught:
        list(decode.Decode(workers_pb2.DecodeRequest(request_id="direct-1", local_prefill=local), timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "adapter: 'nope' is not loaded" in caught.value.details()


def test_load_and_unload_while_serving(cluster, router_over):
    router = router_over([cluster.prefill], [cluster.decode], local_prefill_tokens=0)
    prefill, decode = stubs(cluster)
    for stub in (prefill, decode):
        reply = stub.LoadAdapter(workers_pb2.LoadAdapterRequest(name="beta", path=cluster.folders["beta"]))
        assert [a.name for a in reply.adapters] == ["alpha", "beta"]
    models = wait_for_models(router.stub, {"alpha", "beta"})
    assert [(m.id, m.parent) for m in models][1:] == [("alpha", models[0].id), ("beta", models[0].id)]
    assert generate(router.stub, PROMPT, adapter="beta")[0] == offline(cluster, "beta")
    with pytest.raises(grpc.RpcError) as caught:
        decode.LoadAdapter(workers_pb2.LoadAdapterRequest(name="beta", path=cluster.folders["beta"]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already loaded" in caught.value.details()
    # In use: a long request holds beta on the decode worker, so its unload is refused.
    sampling = generation_pb2.SamplingParameters(max_tokens=400, ignore_eos=True)
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=PROMPT), sampling=sampling, adapter="beta"
    )
    stream = router.stub.Generate(request, timeout=120)
    next(stream)
    with pytest.raises(grpc.RpcError) as caught:
        decode.UnloadAdapter(workers_pb2.UnloadAdapterRequest(name="beta"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "adapter: 'beta' is used by 1 unfinished request" in caught.value.details()
    stream.cancel()
    deadline = time.monotonic() + 30
    while True:
        try:
            decode.UnloadAdapter(workers_pb2.UnloadAdapterRequest(name="beta"))
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the cancelled request never let go of the adapter"
            time.sleep(0.1)
    prefill.UnloadAdapter(workers_pb2.UnloadAdapterRequest(name="beta"))
    assert [m.id for m in wait_for_models(router.stub, {"alpha"}) if m.parent] == ["alpha"]


def test_the_adapters_command_lists_a_workers_adapters(cluster, capsys):
    assert baton(["adapters", "list", "--worker", cluster.decode.address]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["alpha"]
    assert lines[0].split("\t")[1] == cluster.folders["alpha"]
