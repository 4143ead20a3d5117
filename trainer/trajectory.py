"""What the trainer recomputes: trajectories (a prompt and the tokens served after it), packed.

```
 trajectory:   a = prompt p0 p1 p2 | generated g0 g1      b = prompt q0 | generated h0 h1 h2
 packed ids:   p0 p1 p2 g0 g1 q0 h0 h1 h2
 cu_seqlens:   0              5              9
 scored:          .  .  x  x      x  x  x     (the logit row that scores each generated token)
```
A packed batch is one flat sequence of tokens with ``cu_seqlens`` boundaries; the trainer runs it as
one step of fresh sequences. Which trajectories share a batch, and in which order, never changes a
trajectory's bits (batch-invariant numerics).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Trajectory:
    """One served request as the trainer sees it.

    Attributes:
        prompt_ids: the prompt's token ids (at least one).
        output_ids: the tokens the server generated after it (may be empty).
    """

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))
        object.__setattr__(self, "output_ids", tuple(self.output_ids))
        if not self.prompt_ids:
            raise ValueError("prompt_ids: a trajectory needs at least one prompt token")

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.output_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass(frozen=True)
class PackedBatch:
    """Trajectories packed back to back in the given order.

    Attributes:
        trajectories: in packing order.
        cu_seqlens: ``len(trajectories) + 1`` boundaries; trajectory ``i`` holds packed tokens
            ``[cu_seqlens[i], cu_seqlens[i + 1])``.
    """

    trajectories: tuple[Trajectory, ...]
    cu_seqlens: tuple[int, ...]

    @staticmethod
    def pack(trajectories: list[Trajectory]) -> "PackedBatch":
        """Pack ``trajectories`` in list order.

        Raises:
            ValueError: an empty list.
        """
        if not trajectories:
            raise ValueError("trajectories: a packed batch needs at least one trajectory")
        bounds = [0]
        for trajectory in trajectories:
            bounds.append(bounds[-1] + len(trajectory))
        return PackedBatch(tuple(trajectories), tuple(bounds))

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def input_ids(self) -> list[int]:
        """The packed token ids, ``[num_tokens]``."""
        return [token for trajectory in self.trajectories for token in trajectory.token_ids]

    def generated_span(self, index: int) -> slice:
        """Packed positions of trajectory ``index``'s generated tokens."""
        start = self.cu_seqlens[index] + len(self.trajectories[index].prompt_ids)
        return slice(start, self.cu_seqlens[index + 1])
