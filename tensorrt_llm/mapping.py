"""`Mapping`: where one process (rank) sits in the tensor/pipeline-parallel grid."""
from .errors import ConfigError


class Mapping:
    """Ranks are laid out tensor-parallel first: rank = pp_rank * tp_size + tp_rank."""

    def __init__(self, world_size: int = 1, rank: int = 0, tp_size: int = 1, pp_size: int = 1):
        for name, value in (("world_size", world_size), ("tp_size", tp_size), ("pp_size", pp_size)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"Mapping: {name} must be a positive integer, got {value!r}")
        if world_size != tp_size * pp_size:
            raise ConfigError(
                f"Mapping: world_size ({world_size}) must equal tp_size * pp_size "
                f"({tp_size} * {pp_size} = {tp_size * pp_size})")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ConfigError(f"Mapping: rank must be in [0, {world_size}), got {rank!r}")
        self.world_size = world_size
        self.rank = rank
        self.tp_size = tp_size
        self.pp_size = pp_size

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

    def pp_layers(self, num_layers: int) -> list[int]:
        """The global indices of the layers this rank's pipeline stage runs."""
        if num_layers % self.pp_size:
            raise ConfigError(
                f"Mapping: pp_size ({self.pp_size}) must divide the number of layers ({num_layers})")
        per_stage = num_layers // self.pp_size
        return list(range(self.pp_rank * per_stage, (self.pp_rank + 1) * per_stage))

    def with_rank(self, rank: int) -> "Mapping":
        return Mapping(self.world_size, rank, self.tp_size, self.pp_size)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "rank": self.rank,
                "tp_size": self.tp_size, "pp_size": self.pp_size}

    @classmethod
    def from_dict(cls, d: dict) -> "Mapping":
        """Missing keys take their defaults; world_size defaults to tp_size * pp_size."""
        if not isinstance(d, dict):
            raise ConfigError(f"Mapping: must be an object, got {str(d)[:60]!r}")
        unknown = set(d) - {"world_size", "rank", "tp_size", "pp_size"}
        if unknown:
            raise ConfigError(f"Mapping: unknown keys {sorted(unknown)}")
        tp_size = d.get("tp_size", 1)
        pp_size = d.get("pp_size", 1)
        return cls(world_size=d.get("world_size", tp_size * pp_size), rank=d.get("rank", 0),
                   tp_size=tp_size, pp_size=pp_size)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (f"Mapping(world_size={self.world_size}, rank={self.rank}, "
                f"tp_size={self.tp_size}, pp_size={self.pp_size})")
