"""The ``pd`` benchmark's workload: short "decode" requests in concurrent streams, long prefills beside them.

Every prompt is drawn from ``random.Random(seed)``, so a seed fixes the whole request set; both modes
(colocated and disaggregated) run exactly the same requests. Token ids avoid the low special ids, and
every prompt is random from its first token, so no two share a prefix-cache block.
"""

import random
from dataclasses import asdict, dataclass

LOCAL_PREFILL_TOKENS = 16  # the router's default: conditional mode prefills prompts this short on decode
DECODE_PROMPT_TOKENS = (8, LOCAL_PREFILL_TOKENS)  # short enough to stay local in conditional mode
PREFILL_MAX_TOKENS = 2  # a long prefill's first token, then one decode step on the decode worker
MAX_MODEL_LEN = 4096  # the router's and the workers' default
_FIRST_ID = 3  # skips pad, bos and eos of the random checkpoints


@dataclass(frozen=True)
class PDWorkload:
    """What one mode runs, after its warm-up.

    ``decode_streams`` streams each send ``rounds`` decode requests one after another (a new one as
    the previous finishes); each has a 8-16 token prompt and decodes ``decode_tokens`` tokens
    (``ignore_eos``). Meanwhile one thread sends ``prefills`` long requests of ``prefill_len``
    prompt tokens and ``PREFILL_MAX_TOKENS`` output tokens back to back (one in flight at a time).

    Raises:
        ValueError: a value out of range, naming the ``baton bench pd`` flag.
    """

    decode_streams: int = 4
    decode_tokens: int = 32
    rounds: int = 4
    prefill_len: int = 1536
    prefills: int = 6
    seed: int = 0

    def __post_init__(self):
        for flag, value, least in (
            ("--decode-streams", self.decode_streams, 1),
            ("--decode-tokens", self.decode_tokens, 2),  # TPOT needs a token after the first
            ("--rounds", self.rounds, 1),
            ("--prefills", self.prefills, 1),
            ("--seed", self.seed, 0),
        ):
            if value < least:
                raise ValueError(f"{flag}: must be >= {least}, got {value}")
        if not LOCAL_PREFILL_TOKENS < self.prefill_len <= MAX_MODEL_LEN - PREFILL_MAX_TOKENS:
            raise ValueError(
                f"--prefill-len: must be in {LOCAL_PREFILL_TOKENS + 1}..{MAX_MODEL_LEN - PREFILL_MAX_TOKENS} "
                f"(longer than a locally prefilled prompt, within max_model_len), got {self.prefill_len}"
            )
        if DECODE_PROMPT_TOKENS[1] + self.decode_tokens > MAX_MODEL_LEN:
            raise ValueError(
                f"--decode-tokens: prompt + output must fit {MAX_MODEL_LEN}, got {self.decode_tokens}"
            )

    @property
    def decode_requests(self) -> int:
        return self.decode_streams * self.rounds

    def prompts(
        self, vocab_size: int, warmups: int
    ) -> tuple[list[list[list[int]]], list[list[int]], list[list[int]]]:
        """``(decode[stream][round], prefill[i], warmup[i])`` token ids; the same for a given seed.

        The warm-up prompts (``warmups`` short ones, then as many long ones) are drawn last, so they
        differ from all the others.
        """
        rng = random.Random(self.seed)

        def draw(length: int) -> list[int]:
            return [rng.randrange(_FIRST_ID, vocab_size) for _ in range(length)]

        decode = [
            [draw(rng.randint(*DECODE_PROMPT_TOKENS)) for _ in range(self.rounds)]
            for _ in range(self.decode_streams)
        ]
        prefill = [draw(self.prefill_len) for _ in range(self.prefills)]
        warmup = [draw(DECODE_PROMPT_TOKENS[1]) for _ in range(warmups)]
        warmup += [draw(self.prefill_len) for _ in range(warmups)]
        return decode, prefill, warmup

    def as_dict(self) -> dict:
        return asdict(self) | {
            "decode_prompt_tokens": list(DECODE_PROMPT_TOKENS),
            "prefill_max_tokens": PREFILL_MAX_TOKENS,
        }
