"""The kernel benchmark registry on the CPU: every entry imports and is callable; the context and the
limit rows build (the op benchmarks themselves need a GPU: tests/gpu and ``baton bench kernels``)."""

import inspect

import torch

from services.engine.benchmark.kernel_bench import (
    KERNEL_BENCHES,
    KernelBenchContext,
    bench_copy,
    format_results,
    make_context,
    resolve,
)


def test_every_registry_entry_resolves_to_a_benchmark_function():
    functions = resolve(list(KERNEL_BENCHES))
    assert len(functions) == len(KERNEL_BENCHES)
    for (name, bench), function in zip(KERNEL_BENCHES.items(), functions, strict=True):
        assert callable(function), name
        assert f"{function.__module__}:{function.__name__}" == bench.target
        assert list(inspect.signature(function).parameters) == ["context"], name
        assert bench.summary


def test_context_has_the_full_k3_shapes_and_measured_limits():
    context = make_context("cpu", torch.float32)
    assert isinstance(context, KernelBenchContext)
    config = context.config
    assert config.layer_types == ("kda", "kda", "kda", "mla")
    assert (config.hidden_size, config.num_attention_heads, config.kv_lora_rank) == (2304, 32, 512)
    assert (config.moe.num_experts, config.moe.num_experts_per_tok, config.indexer.topk) == (896, 16, 2048)
    assert context.copy_bytes_per_s > 0 and context.matmul_flops > 0
    rows = bench_copy(context)
    table = format_results(rows, "limits")
    assert rows[0].op == "copy" and rows[0].unit == "GB/s" and "H200 HBM" in table
