"""`Mapping`: where one process (rank) sits in the tensor/pipeline-parallel grid, and which
decoder layers each pipeline stage runs."""
from typing import Optional, Sequence

from .errors import ConfigError


class Mapping:
    """Ranks are laid out tensor-parallel first: rank = pp_rank * tp_size + tp_rank.

    pp_partition: the decoder layers of each pipeline stage, in stage order (a list of pp_size
    positive ints summing to the model's layer count), or None for the default split: equal
    stages, the first num_layers % pp_size of them one layer more (so a layer count pp_size
    divides splits evenly, as it always has). Checked against the layer count where that is
    known (`pp_layers`, PretrainedConfig)."""

    def __init__(self, world_size: int = 1, rank: int = 0, tp_size: int = 1, pp_size: int = 1,
                 pp_partition: Optional[Sequence[int]] = None):
        for name, value in (("world_size", world_size), ("tp_size", tp_size), ("pp_size", pp_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Mapping: {name} must be a positive integer, got {value!r}")
        if world_size != tp_size * pp_size:
            raise ConfigError(
                f"Mapping: world_size ({world_size}) must equal tp_size * pp_size "
                f"({tp_size} * {pp_size} = {tp_size * pp_size})")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
            raise ConfigError(f"Mapping: rank must be in [0, {world_size}), got {rank!r}")
        if pp_partition is not None:
            if (isinstance(pp_partition, (str, bytes)) or not isinstance(pp_partition, Sequence)
                    or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in pp_partition)):
                raise ConfigError(f"Mapping: pp_partition must be a list of positive integers (layers per "
                                  f"stage), got {str(pp_partition)[:60]!r}")
            if len(pp_partition) != pp_size:
                raise ConfigError(f"Mapping: pp_partition {list(pp_partition)} has {len(pp_partition)} "
                                  f"stage(s); pp_size is {pp_size}")
            pp_partition = list(pp_partition)
        self.world_size = world_size
        self.rank = rank
        self.tp_size = tp_size
        self.pp_size = pp_size
        self.pp_partition: Optional[list[int]] = pp_partition

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def tp_group(self) -> list[int]:
        return [self.pp_rank * self.tp_size + i for i in range(self.tp_size)]

    @property
    def pp_group(self) -> list[int]:
        return [i * self.tp_size + self.tp_rank for i in range(self.pp_size)]

    def is_first_pp_rank(self) -> bool:
        return self.pp_rank == 0

    def is_last_pp_rank(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def prev_pp_rank(self) -> int:
        """The global rank of this tensor-parallel rank in the previous pipeline stage."""
        return self.rank - self.tp_size

    def next_pp_rank(self) -> int:
        return self.rank + self.tp_size

    def last_pp_rank(self) -> int:
        """The global rank of this tensor-parallel rank in the last pipeline stage."""
        return self.pp_group[-1]

    def stage_layer_counts(self, num_layers: int) -> list[int]:
        """How many of the model's `num_layers` decoder layers each pipeline stage runs:
        pp_partition, or the default split (see the class docstring). ConfigError when
        pp_partition does not sum to num_layers, or a stage would get no layer."""
        if self.pp_partition is not None:
            if sum(self.pp_partition) != num_layers:
                raise ConfigError(f"Mapping: pp_partition {self.pp_partition} sums to {sum(self.pp_partition)}, "
                                  f"not the number of layers ({num_layers})")
            return list(self.pp_partition)
        if num_layers < self.pp_size:
            raise ConfigError(f"Mapping: pp_size ({self.pp_size}) must not exceed the number of layers "
                              f"({num_layers}): every stage runs at least one layer")
        per_stage, extra = divmod(num_layers, self.pp_size)
        return [per_stage + (stage < extra) for stage in range(self.pp_size)]

    def pp_layers(self, num_layers: int) -> list[int]:
        """The global indices of the layers this rank's pipeline stage runs."""
        counts = self.stage_layer_counts(num_layers)
        first = sum(counts[:self.pp_rank])
        return list(range(first, first + counts[self.pp_rank]))

    def with_rank(self, rank: int) -> "Mapping":
        return Mapping(self.world_size, rank, self.tp_size, self.pp_size, self.pp_partition)

    def with_pp_partition(self, pp_partition: Optional[Sequence[int]]) -> "Mapping":
        return Mapping(self.world_size, self.rank, self.tp_size, self.pp_size, pp_partition)

    def to_dict(self) -> dict:
        """pp_partition only when set: a mapping without one reads and writes as it always has."""
        d = {"world_size": self.world_size, "rank": self.rank, "tp_size": self.tp_size, "pp_size": self.pp_size}
        if self.pp_partition is not None:
            d["pp_partition"] = list(self.pp_partition)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Mapping":
        """Missing keys take their defaults; world_size defaults to tp_size * pp_size."""
        if not isinstance(d, dict):
            raise ConfigError(f"Mapping: must be an object, got {str(d)[:60]!r}")
        unknown = set(d) - {"world_size", "rank", "tp_size", "pp_size", "pp_partition"}
        if unknown:
            raise ConfigError(f"Mapping: unknown keys {sorted(unknown)}")
        tp_size = d.get("tp_size", 1)
        pp_size = d.get("pp_size", 1)
        if not isinstance(tp_size, int) or not isinstance(pp_size, int):
            world_size = d.get("world_size", 1)  # the checks below name the bad size
        else:
            world_size = d.get("world_size", tp_size * pp_size)
        return cls(world_size=world_size, rank=d.get("rank", 0), tp_size=tp_size, pp_size=pp_size,
                   pp_partition=d.get("pp_partition"))

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        partition = f", pp_partition={self.pp_partition}" if self.pp_partition is not None else ""
        return (f"Mapping(world_size={self.world_size}, rank={self.rank}, "
                f"tp_size={self.tp_size}, pp_size={self.pp_size}{partition})")


def parse_pp_partition(text: str, pp_size: int) -> list[int]:
    """A command line's --pp_partition ("17,15": layers per stage) as a list; ConfigError
    (one line) when it is not comma-separated positive integers, one per stage of --pp_size."""
    try:
        counts = [int(part) for part in str(text).split(",")]
    except ValueError:
        counts = None
    if not counts or any(n < 1 for n in counts):
        raise ConfigError(f"--pp_partition must be comma-separated positive layer counts, one per "
                          f"pipeline stage (e.g. 17,15), got {text!r}")
    if len(counts) != pp_size:
        raise ConfigError(f"--pp_partition {','.join(map(str, counts))} has {len(counts)} stage(s); "
                          f"--pp_size is {pp_size}")
    return counts


def balanced_pp_partition(num_layers: int, pp_size: int, layer_params: int, last_stage_params: int = 0) -> list[int]:
    """Layers per pipeline stage that even out the stages' parameters (and so their weight
    reads and matmul FLOPs a token): each decoder layer has `layer_params`, and the last stage
    also runs the LM head (`last_stage_params`, vocab x hidden). Minimises the largest stage;
    among the splits that do, the one whose last stage is nearest an even share. The other
    stages split the rest evenly, the first ones taking the remainder; every stage keeps at
    least one layer."""
    if not isinstance(pp_size, int) or pp_size < 1:
        raise ConfigError(f"pp_size must be a positive integer, got {pp_size!r}")
    if num_layers < pp_size:
        raise ConfigError(f"pp_size ({pp_size}) must not exceed the number of layers ({num_layers}): "
                          f"every stage runs at least one layer")
    if pp_size == 1:
        return [num_layers]
    best = None
    for last in range(1, num_layers - pp_size + 2):
        rest = num_layers - last
        largest = max(-(-rest // (pp_size - 1)) * layer_params, last * layer_params + last_stage_params)
        key = (largest, abs(last * pp_size - num_layers), last)
        if best is None or key < best:
            best = key
    last = best[2]
    counts = Mapping(pp_size - 1, 0, 1, pp_size - 1).stage_layer_counts(num_layers - last)
    return counts + [last]
