"""Batching properties of the trajectory queue (pure logic, no HTTP): exact sizes, whole groups, FIFO,
mixed-size buffering, min_batch_allocation and weighted mixing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from atropos_cli.api.queue import BatchQueue, EnvSlot, QueuedGroup, find_subset


def _drain(q: BatchQueue) -> list[list[QueuedGroup]]:
    batches = []
    while (batch := q.take_batch()) is not None:
        batches.append(batch)
    return batches


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=0, max_size=120),
    packs_per_batch=st.integers(1, 4),
)
def test_batches_are_exact_and_never_split_groups(sizes: list[int], packs_per_batch: int) -> None:
    q = BatchQueue(batch_size=8 * packs_per_batch)
    for gid, size in enumerate(sizes):
        q.add(QueuedGroup(gid, None, size))
    seen: set[int] = set()
    for batch in _drain(q):
        assert sum(g.size for g in batch) == q.batch_size
        gids = [g.gid for g in batch]
        assert not seen & set(gids), "a group was served twice"
        seen.update(gids)
    # Nothing lost: every group is either served or still queued.
    assert seen | set(q.queue) == set(range(len(sizes)))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 200), group_size=st.sampled_from([1, 2, 4, 8, 16]), per_batch=st.integers(1, 8))
def test_uniform_groups_come_out_fifo(n: int, group_size: int, per_batch: int) -> None:
    q = BatchQueue(batch_size=group_size * per_batch)
    for gid in range(n):
        q.add(QueuedGroup(gid, 0, group_size))
    served = [g.gid for batch in _drain(q) for g in batch]
    assert served == list(range(len(served)))
    assert len(served) == (n // per_batch) * per_batch


def test_small_groups_pack_up_to_the_largest_size() -> None:
    q = BatchQueue(batch_size=8)
    for gid, size in enumerate([8, 4, 2, 2, 4]):
        q.add(QueuedGroup(gid, None, size))
    assert [g.gid for g in q.take_batch() or []] == [0]
    # Now the largest size is 4: the 4 is a pack and the two 2s make another, in arrival order.
    assert [g.gid for g in q.take_batch() or []] == [1, 2, 3]
    assert q.take_batch() is None
    assert sorted(q.queue) == [4]


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), max_size=12), target=st.integers(1, 12))
def test_find_subset_sums_exactly_or_says_none(sizes: list[int], target: int) -> None:
    picked = find_subset(sizes, target)
    reachable = {0}
    for s in sizes:
        reachable |= {r + s for r in reachable}
    if picked is None:
        assert target not in reachable
    else:
        assert sum(sizes[i] for i in picked) == target
        assert len(set(picked)) == len(picked)


def test_mixed_size_groups_wait_in_the_env_buffer_until_they_sum_to_group_size() -> None:
    q = BatchQueue(batch_size=8)
    q.envs[0] = EnvSlot(env_id=0, group_size=4)
    assert q.add(QueuedGroup(1, 0, 3)) == []
    assert q.add(QueuedGroup(2, 0, 2)) == []
    entered = q.add(QueuedGroup(3, 0, 1))
    assert sorted(g.gid for g in entered) == [1, 3]  # 3 + 1 = 4; the 2 keeps waiting
    assert [g.gid for g in q.envs[0].buffer] == [2]
    assert q.add(QueuedGroup(4, 0, 4)) == [QueuedGroup(4, 0, 4)]


@settings(max_examples=60, deadline=None)
@given(
    counts=st.tuples(st.integers(0, 30), st.integers(0, 30)),
    minimum=st.sampled_from([0.25, 0.5, 0.75]),
)
def test_min_batch_allocation_is_honoured(counts: tuple[int, int], minimum: float) -> None:
    q = BatchQueue(batch_size=16)
    q.envs[0] = EnvSlot(env_id=0, group_size=4, min_batch_allocation=minimum)
    q.envs[1] = EnvSlot(env_id=1, group_size=4)
    gid = 0
    for env_id, n in enumerate(counts):
        for _ in range(n):
            q.add(QueuedGroup(gid, env_id, 4))
            gid += 1
    formed = 0
    while True:
        available = q.env_sequences(0)
        batch = q.take_batch()
        if batch is None:
            break
        formed += 1
        assert sum(g.size for g in batch) == 16
        from_env0 = sum(g.size for g in batch if g.env_id == 0)
        # As in Atropos: the minimum is met unless the env ran short (then it gives all it has, at least one).
        assert from_env0 >= min(int(16 * minimum), available) and from_env0 > 0
    # Draining stops only when no batch can form: env 0 (whose minimum blocks batches) ran dry, or less than a
    # batch is left; so with data in env 0 and a batch's worth queued, at least one batch formed.
    left = q.env_sequences(0) + q.env_sequences(1)
    assert q.env_sequences(0) == 0 or left < 16, (formed, q.env_sequences(0), left)
    if counts[0] > 0 and sum(counts) * 4 >= 16:
        assert formed >= 1


def test_env_with_minimum_and_no_data_blocks_the_batch() -> None:
    q = BatchQueue(batch_size=8)
    q.envs[0] = EnvSlot(env_id=0, group_size=4, min_batch_allocation=0.5)
    q.envs[1] = EnvSlot(env_id=1, group_size=4)
    for gid in range(4):
        q.add(QueuedGroup(gid, 1, 4))
    assert q.take_batch() is None
    q.envs[0].connected = False  # a disconnected env no longer holds batches hostage
    assert q.take_batch() is not None


def test_weighted_mix_splits_batches_by_weight() -> None:
    q = BatchQueue(batch_size=16, mix="weighted")
    q.envs[0] = EnvSlot(env_id=0, group_size=2, weight=3.0)
    q.envs[1] = EnvSlot(env_id=1, group_size=2, weight=1.0)
    # env 1 floods the queue first: FIFO would serve only env 1.
    for gid in range(40):
        q.add(QueuedGroup(gid, 1, 2))
    for gid in range(40, 80):
        q.add(QueuedGroup(gid, 0, 2))
    batch = q.take_batch()
    assert batch is not None and sum(g.size for g in batch) == 16
    assert sum(g.size for g in batch if g.env_id == 0) == 12
    assert sum(g.size for g in batch if g.env_id == 1) == 4
    fifo = BatchQueue(batch_size=16)
    fifo.envs = q.envs
    for gid in range(10):
        fifo.add(QueuedGroup(gid, 1, 2))
    assert {g.env_id for g in fifo.take_batch() or []} == {1}
