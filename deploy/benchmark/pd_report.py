"""The ``pd`` benchmark's results: per-mode latency summaries, their ratios, the table and the JSON."""

from dataclasses import dataclass

import numpy as np

from .pd_workload import LOCAL_PREFILL_TOKENS, PDWorkload
from .request_timing import RequestRecord


def _ms(values: list[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation) in milliseconds; NaN for no values."""
    return float(np.percentile(values, q)) * 1e3 if values else float("nan")


@dataclass(frozen=True)
class ModeReport:
    """One mode's run: its set-up and every workload request's record (warm-up excluded).

    ``disaggregation`` is the router's setting: ``never`` for colocated, else ``conditional`` or
    ``always``. ``wall_s`` is the workload's wall time.
    """

    mode: str
    disaggregation: str
    prefill_workers: int
    decode_workers: int
    records: tuple[RequestRecord, ...]
    wall_s: float

    def of_kind(self, kind: str) -> list[RequestRecord]:
        return [record for record in self.records if record.kind == kind]

    def overlap(self) -> float:
        """Fraction of the decode requests' time during which a long prefill was in flight.

        The long prefills run one at a time, so their intervals do not overlap one another.
        """
        decodes, prefills = self.of_kind("decode"), self.of_kind("prefill")
        inside = sum(d.overlap(p.sent, p.arrivals[-1]) for d in decodes for p in prefills)
        return inside / max(sum(d.e2e for d in decodes), 1e-12)

    def summary(self) -> dict:
        """Latencies in milliseconds (decode requests unless named ``prefill_``) and counts."""
        decodes, prefills = self.of_kind("decode"), self.of_kind("prefill")
        tpots = [record.tpot for record in decodes]
        itls = [gap for record in decodes for gap in record.itls]
        return {
            "tpot_p50_ms": _ms(tpots, 50),
            "tpot_p99_ms": _ms(tpots, 99),
            "itl_p50_ms": _ms(itls, 50),
            "itl_p99_ms": _ms(itls, 99),
            "itl_max_ms": _ms(itls, 100),
            "ttft_p50_ms": _ms([record.ttft for record in decodes], 50),
            "prefill_ttft_p50_ms": _ms([record.ttft for record in prefills], 50),
            "decodes_completed": len(decodes),
            "prefills_completed": len(prefills),
            "prefills_handed_off": sum(record.handed_off for record in prefills),
            "decodes_handed_off": sum(record.handed_off for record in decodes),
            "decode_time_with_prefill_in_flight": self.overlap(),
            "wall_s": self.wall_s,
        }


@dataclass(frozen=True)
class PDReport:
    """Colocated and disaggregated runs of the same workload, measured one after the other."""

    model: str
    workload: PDWorkload
    transfer_backend: str
    worker_threads: int
    worker_args: tuple[str, ...]  # extra ``baton worker`` flags, the same in both modes
    colocated: ModeReport
    disaggregated: ModeReport

    def ratios(self) -> dict:
        """Disaggregated over colocated: below 1 means disaggregation kept decodes faster."""
        ours, base = self.disaggregated.summary(), self.colocated.summary()
        return {key: ours[f"{key}_ms"] / base[f"{key}_ms"] for key in ("tpot_p50", "tpot_p99", "itl_p99")}

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "workload": self.workload.as_dict(),
            "local_prefill_tokens": LOCAL_PREFILL_TOKENS,
            "transfer_backend": self.transfer_backend,
            "worker_threads": self.worker_threads,
            "worker_args": list(self.worker_args),
            "modes": {
                report.mode: {
                    "disaggregation": report.disaggregation,
                    "prefill_workers": report.prefill_workers,
                    "decode_workers": report.decode_workers,
                    **report.summary(),
                }
                for report in (self.colocated, self.disaggregated)
            },
            "ratios_disaggregated_over_colocated": self.ratios(),
        }

    def format_table(self) -> str:
        """Set-up lines, one row per mode, then the ratios."""
        w, col, dis = self.workload, self.colocated, self.disaggregated
        if dis.disaggregation == "conditional":
            how = (
                f"conditional (the default; local_prefill_tokens={LOCAL_PREFILL_TOKENS}): the short decode "
                "prompts prefill on the decode worker, the long prompts hand off to a prefill worker"
            )
        else:
            how = f"{dis.disaggregation}: every prompt is prefilled on a prefill worker and handed off"
        lines = [
            f"pd benchmark: {self.model}, {col.decode_workers} colocated decode workers vs "
            f"{dis.prefill_workers} prefill + {dis.decode_workers} decode workers, "
            f"{self.worker_threads} torch thread(s) per worker"
            + (f", worker flags {' '.join(self.worker_args)}" if self.worker_args else ""),
            f"workload (seed {w.seed}): {w.decode_streams} decode streams x {w.rounds} rounds, "
            f"{w.decode_tokens} tokens each (8-{LOCAL_PREFILL_TOKENS} token prompts); meanwhile "
            f"{w.prefills} long prefills of {w.prefill_len} tokens back to back, 2 tokens each",
            f"disaggregated = {how}; transfer backend {self.transfer_backend}",
            "latencies in ms, of the decode requests unless marked 'long'",
        ]
        header = (
            f"{'mode':<14} {'TPOT p50':>8} {'TPOT p99':>8} {'ITL p50':>8} {'ITL p99':>8} {'ITL max':>8} "
            f"{'TTFT p50':>8} {'long TTFT p50':>13} {'decodes':>7} {'long':>4} {'handed off':>10} "
            f"{'overlap':>7} {'wall s':>6}"
        )
        lines += [header, "-" * len(header)]
        for report in (col, dis):
            s = report.summary()
            latencies = ("tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "itl_max", "ttft_p50")
            lines.append(
                f"{report.mode:<14} "
                + " ".join(f"{s[f'{key}_ms']:>8.1f}" for key in latencies)
                + f" {s['prefill_ttft_p50_ms']:>13.1f} {s['decodes_completed']:>7}"
                f" {s['prefills_completed']:>4} {s['prefills_handed_off']:>10}"
                f" {s['decode_time_with_prefill_in_flight']:>7.0%} {s['wall_s']:>6.1f}"
            )
        r = self.ratios()
        lines.append(
            f"disaggregated / colocated: TPOT p50 {r['tpot_p50']:.3f}, TPOT p99 {r['tpot_p99']:.3f}, "
            f"ITL p99 {r['itl_p99']:.3f}  (below 1: disaggregation is faster)"
        )
        lines.append(
            "overlap: share of decode-request time with a long prefill in flight; "
            "handed off: long prefills that went through a prefill worker"
        )
        return "\n".join(lines)
