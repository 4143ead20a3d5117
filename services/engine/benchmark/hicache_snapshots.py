"""How often each kind of KDA snapshot is read back from the host tier, on a trace replay.

``python -m services.engine.benchmark.hicache_snapshots [--trace FILE] [--sessions N] [--scale S]``
(or ``--weka FILE``: every turn of one WEKA agent session, a subagent's turns after the turn that
spawned it) replays every turn of the first ``N`` multi-turn conversations of a Mooncake conversation trace
(``../shared/traces``; lines grouped by ``load_mooncake(conversations=True)``; one request at a time,
in file order, so other conversations' turns come between two turns of one) through a random tiny
``k3`` engine whose device pool holds a small share of the replay's working set and whose host tier
holds all of it, and prints per snapshot reason
(``services/engine/cache/snapshot_policy.py``) how many were written to the tier and how many times
they were restored from it (the numbers behind ``docs/hicache.md``, "Snapshot placement").
"""

import argparse
import json
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from common.sampling_params import SamplingParams
from loadtest.workload import Session, Turn
from loadtest.workloads.mooncake import load_mooncake
from loadtest.workloads.weka import load_weka
from services.engine.checkpoint.init_folder import init_checkpoint
from services.engine.llm import LLM

DEFAULT_TRACE = (
    Path(__file__).resolve().parents[3] / ".." / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
)


def conversation_turns(trace: Path, sessions: int, scale: int, vocab: int) -> list[Turn]:
    """Every turn of the first ``sessions`` conversations of ``trace`` with two turns or more, in the
    order the trace sends them."""
    if sessions < 1:
        raise ValueError(f"--sessions: must be >= 1, got {sessions}")
    workload = load_mooncake(trace, scale, vocab, conversations=True)
    chosen = [session for session in workload.sessions if len(session.turns) > 1][:sessions]
    if len(chosen) < sessions:
        raise ValueError(f"--sessions: {trace} has {len(chosen)} conversations of two turns or more")
    return sorted((turn for session in chosen for turn in session.turns), key=lambda turn: turn.at_s)


def agent_turns(trace: Path, scale: int, vocab: int) -> list[Turn]:
    """Every turn of the WEKA agent session ``trace``, each subagent's turns right after the turn that
    spawned it (the agent waits for its subagents)."""

    def flatten(sessions: tuple[Session, ...]) -> Iterator[Turn]:
        for session in sessions:
            for turn in session.turns:
                yield turn
                yield from flatten(turn.subagents)

    return list(flatten(load_weka(trace, scale, vocab).sessions))


def replay(turns_of: Callable[[int], list[Turn]], stride: int, pool_share: float) -> dict:
    """Replay the turns ``turns_of(vocab)`` one at a time; returns the counts (see the module)."""
    with tempfile.TemporaryDirectory() as folder:
        init_checkpoint(Path(folder), "k3", "tiny")
        vocab = json.loads((Path(folder) / "config.json").read_text())["vocab_size"]
        turns = turns_of(vocab)
        block = 16
        working_set = sum(-(-len(t.prompt_ids) // block) for t in turns)
        longest = max(len(t.prompt_ids) + t.max_tokens for t in turns)
        pool = max(-(-longest // block) + 1, int(working_set * pool_share))
        llm = LLM(
            folder,
            dtype="float32",
            block_size=block,
            num_blocks=pool,
            max_num_seqs=1,
            max_model_len=longest + block,
            max_num_batched_tokens=512,
            snapshot_stride=stride,
            host_cache_gib=0.25,
        )
        cached = cached_host = computed = 0
        for turn in turns:
            params = SamplingParams(
                max_tokens=max(1, min(turn.max_tokens, 8)), temperature=0, ignore_eos=True
            )
            (output,) = llm.generate([list(turn.prompt_ids)], params)
            cached += output.num_cached_tokens
            cached_host += output.num_cached_tokens_host
            computed += len(turn.prompt_ids) - output.num_cached_tokens
        llm.engine.check_integrity()
        host = llm.engine.cache.host
        return {
            "requests": len(turns),
            "device_pool_blocks": pool,
            "working_set_blocks": working_set,
            "prompt_tokens_cached": cached,
            "prompt_tokens_cached_host": cached_host,
            "prompt_tokens_computed": computed,
            "snapshots_saved": dict(host.snapshots_saved),
            "snapshots_restored": dict(host.snapshots_restored),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="a Mooncake conversation trace")
    parser.add_argument("--weka", type=Path, help="replay this WEKA agent session instead of --trace")
    parser.add_argument("--sessions", type=int, default=16, help="conversations replayed, every turn")
    parser.add_argument("--scale", type=int, default=32, help="token divisor (512-token blocks -> 16)")
    parser.add_argument("--snapshot-stride", type=int, default=1, help="the engine's default: 1")
    parser.add_argument("--pool-share", type=float, default=0.1, help="device pool / working set")
    args = parser.parse_args(argv)
    if args.weka is not None:
        turns_of = partial(agent_turns, args.weka, args.scale)
    else:
        turns_of = partial(conversation_turns, args.trace, args.sessions, args.scale)
    result = replay(turns_of, args.snapshot_stride, args.pool_share)
    print(json.dumps(result, indent=1))
    print(f"{'reason':<12}{'saved':>8}{'restored':>10}{'read-back':>11}")
    for reason, saved in sorted(result["snapshots_saved"].items()):
        restored = result["snapshots_restored"].get(reason, 0)
        print(f"{reason:<12}{saved:>8}{restored:>10}{restored / saved:>11.2f}")


if __name__ == "__main__":
    main()
