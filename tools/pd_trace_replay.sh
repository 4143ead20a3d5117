#!/usr/bin/env bash
# Colocated against disaggregated on one host: WEKA agent traces replayed by `baton loadtest` over a
# concurrency sweep, each mode on its own `baton serve` (the same number of worker processes: one
# prefill + one decode, or two colocated decode workers), then `baton loadtest-compare` (the frontier
# plot: throughput against TTFT / TPOT per level).
#
#   tools/pd_trace_replay.sh OUT TRACES [MODEL]
#
# TRACES is a WEKA file or folder; MODEL a checkpoint folder (default: a real-shape K3 of 4 layers,
# three KDA and one MLA with its DSA indexer, 64 routed experts, random bf16 weights, made first in a
# temporary folder, not under OUT).
# SERVE_FLAGS and LOADTEST_FLAGS add to both modes' commands (e.g. the devices, the sweep); MODES sets
# their order (default "disaggregated colocated": the first one pays the cold compile caches).
set -euo pipefail
out=$1 traces=$2 model=${3:-}
mkdir -p "$out"
baton=(python3 -m cli.main)
if [ -z "$model" ]; then
    model=$(mktemp -d)/k3-full-4
    python3 - "$model" <<'EOF'
import sys
from pathlib import Path
from services.engine.checkpoint.init_folder import init_checkpoint
from services.engine.checkpoint.presets import preset_config, with_layers

config = with_layers(preset_config("k3", "full"), 4)
init_checkpoint(Path(sys.argv[1]), "k3", "full", overrides={**config, "num_experts": 64})
EOF
fi

serve_and_replay() {  # mode, serve flags...
    local mode=$1
    shift
    local log=$out/serve_$mode.log
    "${baton[@]}" serve --model "$model" --port 0 --no-redis "$@" ${SERVE_FLAGS:-} >"$log" 2>&1 &
    local pid=$! router=""
    for _ in $(seq 600); do
        router=$(sed -n 's/^SERVING router=\([^ ]*\) .*/\1/p' "$log")
        [ -n "$router" ] && break
        kill -0 $pid 2>/dev/null || { tail -30 "$log"; return 1; }
        sleep 1
    done
    [ -n "$router" ] || { echo "$mode: no SERVING line in 600 s" >&2; kill $pid; return 1; }
    "${baton[@]}" loadtest --target "grpc://$router" --workload trace --trace "$traces" --label "$mode" \
        --out "$out/$mode" --no-progress ${LOADTEST_FLAGS:-} || true
    kill -INT $pid
    wait $pid || true
}

for mode in ${MODES:-disaggregated colocated}; do
    case $mode in
        disaggregated) serve_and_replay disaggregated --prefill-workers 1 --decode-workers 1 --always-disaggregate ;;
        colocated) serve_and_replay colocated --colocated --decode-workers 2 ;;
        *) echo "MODES: unknown mode $mode (disaggregated, colocated)" >&2; exit 2 ;;
    esac
done
"${baton[@]}" loadtest-compare --out "$out/compare" "disaggregated=$out/disaggregated" "colocated=$out/colocated"
