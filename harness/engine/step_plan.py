"""One engine step's layout in host ints: which slot and position each of its token rows has.

A step's rows are first one row per decoding sequence, then the prefill chunks
of any number of sequences, concatenated (varlen). Each running sequence owns
one *slot* of the model's KV cache for its lifetime (the scheduler hands slots
out). Everything the model needs to size a step's work is here, on the host,
so a step never reads a device value back (see ``harness.engine.opcount``);
``harness.engine.model.Transformer.stage`` turns a plan into device tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Chunk:
    """A prefill chunk: ``length`` tokens of the sequence in ``slot`` at positions [start, start+length)."""

    slot: int
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass
class StepPlan:
    """The layout of a step's rows in host ints: B decode rows, then each chunk's rows.

    Decode row b is the newest token of the sequence in ``decode_slots[b]``, at
    ``decode_positions[b]`` (it attends to positions [0, decode_positions[b]]).
    """

    decode_slots: list[int] = field(default_factory=list)
    decode_positions: list[int] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def n_decode(self) -> int:
        return len(self.decode_slots)

    @property
    def n_rows(self) -> int:
        return self.n_decode + sum(c.length for c in self.chunks)

    @property
    def n_slots(self) -> int:
        """Decode attention runs over slots [0, n_slots): a view of the cache, not a gather."""
        return max(self.decode_slots) + 1 if self.decode_slots else 0

    @property
    def max_len(self) -> int:
        """The longest KV length among the decode rows."""
        return max(self.decode_positions) + 1 if self.decode_positions else 0

    def index_lists(self) -> tuple[list[int], list[int], list[int]]:
        """(slot of each row, position of each row, keys each of the first n_slots slots may see).

        The first two say where each row's K/V goes in the cache; the third is
        the decode rows' ragged lengths (1 for a slot with no decode row: its
        dummy query sees one key and is dropped).
        """
        slots = list(self.decode_slots)
        positions = list(self.decode_positions)
        for c in self.chunks:
            slots.extend([c.slot] * c.length)
            positions.extend(range(c.start, c.end))
        lengths = [1] * self.n_slots
        for s, p in zip(self.decode_slots, self.decode_positions, strict=True):
            lengths[s] = p + 1
        return slots, positions, lengths

    def last_rows(self) -> list[int]:
        """The row of each chunk's last token."""
        rows, at = [], self.n_decode
        for c in self.chunks:
            at += c.length
            rows.append(at - 1)
        return rows

    def check(self, max_num_seqs: int, max_model_len: int) -> None:
        if len(self.decode_slots) != len(self.decode_positions):
            raise ValueError(f"{len(self.decode_slots)} decode slots but {len(self.decode_positions)} positions")
        for c in self.chunks:
            if c.length <= 0 or c.start < 0 or c.end > max_model_len:
                raise ValueError(f"prefill chunk [{c.start}, {c.end}) outside [0, {max_model_len})")
        for p in self.decode_positions:
            if not 0 <= p < max_model_len:
                raise ValueError(f"decode position {p} outside [0, {max_model_len})")
        every = self.decode_slots + [c.slot for c in self.chunks]
        for s in every:
            if not 0 <= s < max_num_seqs:
                raise ValueError(f"slot {s} outside [0, {max_num_seqs})")
        if len(set(every)) != len(every):
            raise ValueError("a slot appears twice in one step")
