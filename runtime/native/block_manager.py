"""BlockManager: the paged KV cache's bookkeeping (which blocks hold which sequence's tokens).

Blocks are `block_size` token slots. A block is in exactly one of three states:
  free       reference count 0, no content worth keeping;
  evictable  reference count 0, but a full block registered in the prefix cache (kept in LRU order
             and handed out again only when no free block is left);
  used       reference count > 0 (in that many sequences' block tables).

Prefix caching: a full block's identity is a hash of its token ids chained with the previous block's
hash (the first block's chain starts from the sequence's `cache_salt`, e.g. a LoRA adapter name). A
block is registered only after its K/V have been computed, so a hit is always safe to read.

Sharing: `fork` makes a child reference the parent's blocks; the first write into a shared, partly
filled block copies it (copy-on-write): `append_slots` returns (src, dst) pairs the model runner
copies before the step's forward pass.

Every change to a sequence's block table is also written, as a diff, into `tables` (runtime/native/block_tables.py), from
which the model runner gathers a step's tables without converting the Python lists again.

Sliding windows: when every layer of the model slides (`window`: the keys a query sees), a sequence's leading blocks
that lie wholly before its next token's window are given back as it advances (`release_outside_window`; they stay in
the prefix cache where registered). Their ids stay in the table, stale (attention never reads them), and the first
`seq.num_released_blocks` entries are skipped wherever references are counted. With global layers too (Gemma 3,
gpt-oss) every block stays: those layers read them; the sliding layers' kernels read only their window's blocks.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from collections.abc import Sequence as Seq

from runtime.native.block_tables import BlockTables
from runtime.native.sequence import Sequence


class NoFreeBlocksError(RuntimeError):
    """Internal: an allocation was attempted without checking `can_append` first."""


class BlockManager:
    """Allocate, share, cache and free KV blocks with reference counts."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 window: int | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token (got {num_blocks} x {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.window = window  # every layer's sliding window (None: some layer reads every key)
        self.ref_counts = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._key: list[tuple[int, tuple[int, ...]] | None] = [None] * num_blocks  # exact (prev, tokens)
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.tables = BlockTables()  # the live sequences' block tables, for the model runner

    # ---- counts -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: truly free plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache -------------------------------------------------------------------------
    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks matching `seq`'s leading full blocks; at least one token is left to compute."""
        if not self.enable_prefix_caching or seq.needs_prompt_logits or seq.block_table:
            return []
        hits: list[int] = []
        for i in range((seq.num_tokens - 1) // self.block_size):
            block = self._cached.get(self._block_hash(seq, i))
            if block is None or self._key[block] != self._block_key(seq, i):
                break
            hits.append(block)
        return hits

    def commit(self, seq: Sequence) -> None:
        """Register `seq`'s computed full blocks in the prefix cache (call after each step)."""
        full = seq.num_computed_tokens // self.block_size
        if self.enable_prefix_caching:
            for i in range(seq.num_committed_blocks, full):
                block = seq.block_table[i]
                if self._hash[block] is not None:
                    continue  # a cache hit, or shared with a forked sibling that registered it
                h = self._block_hash(seq, i)
                if h not in self._cached:  # an identical block registered earlier stays the cached one
                    self._cached[h] = block
                    self._hash[block] = h
                    self._key[block] = self._block_key(seq, i)
        seq.num_committed_blocks = max(seq.num_committed_blocks, full)

    def _block_key(self, seq: Sequence, i: int) -> tuple[int, tuple[int, ...]]:
        prev = self._block_hash(seq, i - 1) if i else self._root(seq)
        return prev, tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])

    def _block_hash(self, seq: Sequence, i: int) -> int:
        while len(seq.block_hashes) <= i:
            j = len(seq.block_hashes)
            tokens = seq.token_ids[j * self.block_size : (j + 1) * self.block_size]
            assert len(tokens) == self.block_size, "only full blocks are hashed"
            prev = seq.block_hashes[j - 1] if j else self._root(seq)
            seq.block_hashes.append(hash((prev, tuple(tokens))))
        return seq.block_hashes[i]

    @staticmethod
    def _root(seq: Sequence) -> int:
        return hash(("prefix-root", seq.cache_salt))

    # ---- allocation ---------------------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_new_tokens: int, cached: Seq[int] = ()) -> int:
        """Free blocks taken by attaching `cached` (first admission) and appending `num_new_tokens`."""
        start = seq.num_computed_tokens + len(cached) * self.block_size
        grow = max(0, self.blocks_for(start + num_new_tokens) - len(seq.block_table) - len(cached))
        revive = sum(1 for b in cached if self.ref_counts[b] == 0)
        return grow + revive + (1 if self._needs_copy(seq, start) else 0)

    def can_append(self, seq: Sequence, num_new_tokens: int, cached: Seq[int] = ()) -> bool:
        return self.blocks_needed(seq, num_new_tokens, cached) <= self.num_free_blocks

    def attach_prefix(self, seq: Sequence, cached: Seq[int]) -> None:
        """Start an empty sequence's block table with prefix-cache hits; they count as computed."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        for block in cached:
            self._acquire(block)
        seq.block_table = list(cached)
        seq.num_computed_tokens = len(cached) * self.block_size
        seq.num_committed_blocks = len(cached)
        self.tables.write(seq)

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Make room for the next `num_new_tokens` tokens; returns (src, dst) block copies to run first."""
        start = seq.num_computed_tokens
        copies: list[tuple[int, int]] = []
        changed = len(seq.block_table)  # the first entry of the table this call changes
        if self._needs_copy(seq, start):
            i = start // self.block_size
            shared = seq.block_table[i]
            fresh = self._take()
            copies.append((shared, fresh))
            self._release(shared)
            seq.block_table[i] = fresh
            changed = i
        while len(seq.block_table) * self.block_size < start + num_new_tokens:
            seq.block_table.append(self._take())
        if changed < len(seq.block_table) or seq.table_row < 0:
            self.tables.write(seq, changed)
        return copies

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Release `seq`'s blocks past its first `num_tokens` tokens (rejected speculative tokens' slots)."""
        keep = self.blocks_for(num_tokens)
        for block in reversed(seq.block_table[keep:]):
            self._release(block)
        del seq.block_table[keep:]
        self.tables.write(seq, keep)  # its length

    def fork(self, child: Sequence) -> None:
        """`child` (from Sequence.fork) now references its parent's blocks too."""
        for block in child.block_table[child.num_released_blocks :]:
            self._acquire(block)
        self.tables.write(child)

    def release_outside_window(self, seq: Sequence) -> None:
        """Give back `seq`'s committed leading blocks that lie wholly before the window of its next token (every
        layer sliding: `window`)."""
        if self.window is None:
            return
        first_seen = max(0, seq.num_computed_tokens - self.window + 1)  # the next query's first key
        end = min(first_seen // self.block_size, seq.num_committed_blocks)
        for i in range(seq.num_released_blocks, end):
            self._release(seq.block_table[i])
        seq.num_released_blocks = max(seq.num_released_blocks, end)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references; its cache content is forgotten (recomputed if it runs again)."""
        # Tail blocks first, so their cached copies are evicted before the (more shareable) head's.
        for block in reversed(seq.block_table[seq.num_released_blocks :]):
            self._release(block)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_committed_blocks = 0
        seq.num_released_blocks = 0
        self.tables.release(seq)

    def _needs_copy(self, seq: Sequence, start: int) -> bool:
        """Writing at `start` would land in a partly filled block another sequence also references."""
        i = start // self.block_size
        return start % self.block_size != 0 and i < len(seq.block_table) and self.ref_counts[seq.block_table[i]] > 1

    def _take(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._cached[self._hash[block]]  # type: ignore[arg-type]
            self._hash[block] = None
            self._key[block] = None
        else:
            raise NoFreeBlocksError("no free KV block (the scheduler should have checked)")
        self.ref_counts[block] = 1
        return block

    def _acquire(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self._evictable[block]  # only cached blocks are acquired while free
        self.ref_counts[block] += 1

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        assert self.ref_counts[block] >= 0, f"block {block} released more often than taken"
        if self.ref_counts[block] == 0:
            if self._hash[block] is not None:
                self._evictable[block] = None
            else:
                self._free.append(block)

    # ---- checking -----------------------------------------------------------------------------
    def check_invariants(self, live: Iterable[Sequence]) -> None:
        """Raise AssertionError unless every block is accounted for exactly once (tests, debugging)."""
        refs = [0] * self.num_blocks
        for seq in live:
            for block in seq.block_table[seq.num_released_blocks :]:
                refs[block] += 1
            assert self.tables.row(seq) == seq.block_table, f"{seq}'s resident block table is stale"
        assert self.tables.rows_in_use == sum(seq.table_row >= 0 for seq in live), "a resident table row leaked"
        assert refs == self.ref_counts, "reference counts differ from the live block tables"
        free, evictable = set(self._free), set(self._evictable)
        assert len(free) == len(self._free) and not free & evictable, "a block is listed twice"
        for block in range(self.num_blocks):
            in_use = self.ref_counts[block] > 0
            assert in_use + (block in free) + (block in evictable) == 1, f"block {block} in no or many states"
            assert (block in evictable) <= (self._hash[block] is not None), f"evictable block {block} has no hash"
            assert (block in free) <= (self._hash[block] is None), f"free block {block} still cached"
        for h, block in self._cached.items():
            assert self._hash[block] == h, f"cache entry of block {block} is stale"
        assert sum(h is not None for h in self._hash) == len(self._cached)
