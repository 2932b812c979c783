"""tiering.clairvoyant (samplers, order files, launcher ranks) against the real torch samplers and DataLoaders: equal, element for
element, over seeds, sizes, world sizes, ranks, epochs and batch settings."""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, RandomSampler, SequentialSampler  # noqa: E402

from tiering.clairvoyant.launcher import local_ranks, parse_slurm_tasks_per_node, ranks_from_env  # noqa: E402
from tiering.clairvoyant.orderfile import read_order_file  # noqa: E402
from tiering.clairvoyant.samplers import OrderError, SamplerSpec, epoch_order, epoch_orders, node_stream  # noqa: E402

SIZES = (1, 2, 7, 100, 1001)
WORLDS = (1, 2, 3, 8)
EPOCHS = 5


class IndexDataset(Dataset):
    """Returns the index it is asked for."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def loader_epochs(loader: DataLoader, epochs: int = EPOCHS) -> list[list[int]]:
    """What a training loop reads: a fresh `for batch in loader` per epoch."""
    out = []
    for _ in range(epochs):
        out.append([i for batch in loader for i in batch.tolist()])
    return out


def sampler_epochs(sampler, epochs: int = EPOCHS) -> list[list[int]]:
    return [list(sampler) for _ in range(epochs)]


def check_random(spec: SamplerSpec, n: int, expected: list[list[int]]) -> None:
    assert list(epoch_orders(spec, n, len(expected))) == expected
    # out of order and one at a time: the state cache must give the same
    for e in (len(expected) - 1, 0, 2, 1):
        if e < len(expected):
            assert epoch_order(spec, n, e) == expected[e], (spec, n, e)


# ------------------------------------------------------------ RandomSampler alone

@pytest.mark.parametrize("n", SIZES)
def test_random_sampler_alone(n: int) -> None:
    for seed in (0, 1, 42, 2**40 + 3):
        expected = sampler_epochs(RandomSampler(range(n), generator=seeded(seed)))
        check_random(SamplerSpec("random", seed=seed, dataloader=False), n, expected)


@pytest.mark.parametrize("n", (1, 2, 7, 100))
def test_random_sampler_num_samples_and_replacement(n: int) -> None:
    variants = [dict(num_samples=k) for k in (1, n, 2 * n, 3 * n + 1, 33)]
    variants += [dict(replacement=True, num_samples=k) for k in (None, 1, 31, 32, 33, 64, 100, 250)]
    for kw, seed in itertools.product(variants, (0, 5, 123)):
        expected = sampler_epochs(RandomSampler(range(n), generator=seeded(seed), **kw))
        spec = SamplerSpec("random", seed=seed, dataloader=False, **kw)
        check_random(spec, n, expected)


def test_random_sampler_draws_a_trailing_unused_permutation() -> None:
    g = seeded(9)
    list(RandomSampler(range(10), generator=g))
    two = seeded(9)
    torch.randperm(10, generator=two)
    torch.randperm(10, generator=two)
    assert torch.equal(g.get_state(), two.get_state())


# ------------------------------------------------------------ DataLoader(shuffle=True, generator=g)

@pytest.mark.parametrize("n", SIZES)
def test_dataloader_shuffle_single_process(n: int) -> None:
    for seed, batch, drop in itertools.product((0, 7, 2024), (1, 3, 8, 64), (False, True)):
        loader = DataLoader(IndexDataset(n), batch_size=batch, shuffle=True, drop_last=drop,
                            generator=seeded(seed), num_workers=0)
        expected = loader_epochs(loader)
        spec = SamplerSpec("random", seed=seed, batch_size=batch, batch_drop_last=drop)
        check_random(spec, n, expected)


def test_dataloader_shifts_the_stream_by_the_base_seed() -> None:
    loader = DataLoader(IndexDataset(50), batch_size=4, shuffle=True, generator=seeded(1))
    through_loader = loader_epochs(loader, 2)
    alone = sampler_epochs(RandomSampler(range(50), generator=seeded(1)), 2)
    assert through_loader != alone
    assert list(epoch_orders(SamplerSpec("random", seed=1, dataloader=False), 50, 2)) == alone
    assert list(epoch_orders(SamplerSpec("random", seed=1), 50, 2)) == through_loader


def test_dataloader_with_explicit_random_sampler_on_its_generator() -> None:
    for kw in (dict(replacement=True), dict(replacement=True, num_samples=70),
               dict(num_samples=25), dict(num_samples=3)):
        g = seeded(4)
        loader = DataLoader(IndexDataset(10), batch_size=4, generator=g,
                            sampler=RandomSampler(range(10), generator=g, **kw))
        check_random(SamplerSpec("random", seed=4, batch_size=4, **kw), 10, loader_epochs(loader))


@pytest.mark.parametrize("n,batch,drop,persistent", [
    (10, 3, False, False), (12, 4, True, False), (3, 8, False, False), (100, 7, True, True),
])
def test_dataloader_shuffle_two_workers(n: int, batch: int, drop: bool, persistent: bool) -> None:
    loader = DataLoader(IndexDataset(n), batch_size=batch, shuffle=True, drop_last=drop,
                        generator=seeded(11), num_workers=2, persistent_workers=persistent)
    expected = loader_epochs(loader, 3)
    spec = SamplerSpec("random", seed=11, batch_size=batch, batch_drop_last=drop,
                       persistent_workers=persistent)
    check_random(spec, n, expected)
    if persistent:  # only the first iterator draws a base seed
        plain = SamplerSpec("random", seed=11, batch_size=batch, batch_drop_last=drop)
        assert list(epoch_orders(plain, n, 3))[1:] != expected[1:]


# ------------------------------------------------------------ DistributedSampler

@pytest.mark.parametrize("n", SIZES)
def test_distributed_sampler(n: int) -> None:
    for world, shuffle, drop, seed in itertools.product(WORLDS, (True, False), (False, True), (0, 17)):
        for rank in range(world):
            sampler = DistributedSampler(IndexDataset(n), num_replicas=world, rank=rank,
                                         shuffle=shuffle, seed=seed, drop_last=drop)
            spec = SamplerSpec("distributed", seed=seed, num_replicas=world, rank=rank,
                               shuffle=shuffle, drop_last=drop)
            for epoch in range(EPOCHS):
                sampler.set_epoch(epoch)
                assert epoch_order(spec, n, epoch) == list(sampler), (n, world, rank, shuffle, drop, epoch)
            assert list(epoch_orders(spec, n, 2))[1] == epoch_order(spec, n, 1)


def test_distributed_padding_larger_than_the_data_set() -> None:
    # 1 sample over 8 ranks: padding 7 > 1 takes torch's second branch
    for rank in range(8):
        sampler = DistributedSampler(IndexDataset(1), num_replicas=8, rank=rank)
        assert epoch_order(SamplerSpec("distributed", num_replicas=8, rank=rank), 1, 0) == list(sampler) == [0]
    for rank in range(8):  # and 3 over 8: padding 5 > 3
        sampler = DistributedSampler(IndexDataset(3), num_replicas=8, rank=rank, seed=2)
        sampler.set_epoch(3)
        assert epoch_order(SamplerSpec("distributed", seed=2, num_replicas=8, rank=rank), 3, 3) == list(sampler)


def test_distributed_seed_none_means_the_default_zero() -> None:
    sampler = DistributedSampler(IndexDataset(20), num_replicas=3, rank=1)
    sampler.set_epoch(2)
    assert epoch_order(SamplerSpec("distributed", num_replicas=3, rank=1), 20, 2) == list(sampler)


@pytest.mark.parametrize("n", (7, 100, 1001))
def test_distributed_through_a_dataloader_with_drop_last(n: int) -> None:
    for world, batch, drop in itertools.product((2, 3), (4, 7), (False, True)):
        for rank in range(world):
            sampler = DistributedSampler(IndexDataset(n), num_replicas=world, rank=rank, seed=5)
            loader = DataLoader(IndexDataset(n), batch_size=batch, sampler=sampler, drop_last=drop)
            spec = SamplerSpec("distributed", seed=5, num_replicas=world, rank=rank,
                               batch_size=batch, batch_drop_last=drop)
            for epoch in range(3):
                sampler.set_epoch(epoch)
                assert epoch_order(spec, n, epoch) == loader_epochs(loader, 1)[0]


# ------------------------------------------------------------ sequential and BatchSampler

@pytest.mark.parametrize("n", SIZES)
def test_sequential(n: int) -> None:
    for batch, drop in itertools.product((None, 1, 3, 8, 2000), (False, True)):
        if batch is None:
            expected = list(SequentialSampler(range(n)))
            spec = SamplerSpec("sequential")
        else:
            expected = [i for b in BatchSampler(SequentialSampler(range(n)), batch, drop) for i in b]
            loader = DataLoader(IndexDataset(n), batch_size=batch, shuffle=False, drop_last=drop)
            assert loader_epochs(loader, 1)[0] == expected
            spec = SamplerSpec("sequential", batch_size=batch, batch_drop_last=drop)
        assert [epoch_order(spec, n, e) for e in range(3)] == [expected] * 3
        assert list(epoch_orders(spec, n, 3)) == [expected] * 3


def test_batch_drop_last_through_batch_sampler_on_random() -> None:
    for n, batch in ((10, 3), (12, 4), (5, 8), (1001, 64)):
        g = seeded(3)
        batches = BatchSampler(RandomSampler(range(n), generator=g), batch, drop_last=True)
        expected = [[i for b in batches for i in b] for _ in range(EPOCHS)]
        spec = SamplerSpec("random", seed=3, dataloader=False, batch_size=batch, batch_drop_last=True)
        check_random(spec, n, expected)


# ------------------------------------------------------------ node stream

def test_node_stream_interleaves_the_local_ranks() -> None:
    n, world, local = 1001, 8, 4
    for rank in (0, 5):
        ranks = local_ranks(world, rank, local)
        specs = [SamplerSpec("distributed", seed=1, num_replicas=world, rank=r) for r in ranks]
        samplers = [DistributedSampler(IndexDataset(n), num_replicas=world, rank=r, seed=1) for r in ranks]
        for s in samplers:
            s.set_epoch(2)
        orders = [list(s) for s in samplers]
        expected = [o[p] for p in range(len(orders[0])) for o in orders]
        assert node_stream(specs, n, 2) == expected


def test_node_stream_with_unequal_lengths() -> None:
    specs = [SamplerSpec("random", seed=1, num_samples=3, dataloader=False),
             SamplerSpec("random", seed=2, num_samples=5, dataloader=False)]
    a, b = (epoch_order(s, 10, 0) for s in specs)
    assert node_stream(specs, 10, 0) == [a[0], b[0], a[1], b[1], a[2], b[2], b[3], b[4]]
    with pytest.raises(OrderError):
        node_stream([], 10, 0)


# ------------------------------------------------------------ bad specs and arguments

def test_bad_specs_and_arguments() -> None:
    with pytest.raises(OrderError, match="seed"):
        epoch_order(SamplerSpec("random"), 10, 0)
    with pytest.raises(OrderError, match="seed"):
        epoch_orders(SamplerSpec("random"), 10, 3)   # raises at the call, not at next()
    with pytest.raises(OrderError, match="kind"):
        SamplerSpec("shuffled")
    with pytest.raises(OrderError, match="rank"):
        SamplerSpec("distributed", num_replicas=2, rank=2)
    with pytest.raises(OrderError, match="batch_size"):
        SamplerSpec("sequential", batch_drop_last=True)
    with pytest.raises(OrderError, match="num_samples"):
        SamplerSpec("random", seed=1, num_samples=0)
    with pytest.raises(OrderError, match="at least one"):
        epoch_order(SamplerSpec("sequential"), 0, 0)
    with pytest.raises(OrderError, match="epoch"):
        epoch_order(SamplerSpec("sequential"), 5, -1)


# ------------------------------------------------------------ order files

def test_order_file_text_with_epochs_and_comments(tmp_path: Path) -> None:
    f = tmp_path / "order.txt"
    f.write_text("# order of job 7\n# epoch 0\n3\n1\r\n  2  \n\n\n# epoch 1\n0\n4\n# note\n5\n\n")
    assert read_order_file(f) == [[3, 1, 2], [0, 4, 5]]
    g = tmp_path / "plain.txt"
    g.write_text("1\n2\n\n3\n")
    assert read_order_file(g) == [[1, 2], [3]]


def test_order_file_paths_through_resolve(tmp_path: Path) -> None:
    names = {"a/x.jpg": 0, "b/ünï y.jpg": 1, "c.jpg": 2}
    f = tmp_path / "order.txt"
    f.write_text("c.jpg\nb/ünï y.jpg\n7\n# EPOCH\na/x.jpg\n", encoding="utf-8")
    assert read_order_file(f, names.__getitem__) == [[2, 1, 7], [0]]


def test_order_file_errors_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "order.txt"
    f.write_text("1\n2\nfoo.jpg\n")
    with pytest.raises(OrderError, match=r"line 3.*foo\.jpg"):
        read_order_file(f)
    with pytest.raises(OrderError, match=r"line 3.*foo\.jpg"):
        read_order_file(f, {"bar.jpg": 0}.__getitem__)
    with pytest.raises(OrderError, match=r"line 3.*not an index"):
        read_order_file(f, lambda p: -1)

    class Custom(Exception):
        pass

    def refuse(p: str) -> int:
        raise Custom("outside the data set")

    with pytest.raises(Custom) as info:
        read_order_file(f, refuse)
    assert any("line 3" in note for note in info.value.__notes__)
    empty = tmp_path / "empty.txt"
    empty.write_text("# epoch\n\n")
    with pytest.raises(OrderError, match="no indices"):
        read_order_file(empty)
    with pytest.raises(OrderError, match="cannot read"):
        read_order_file(tmp_path / "missing.txt")


def test_order_file_npy(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    one = tmp_path / "one.npy"
    np.save(one, np.array([4, 0, 2], dtype=np.int32))
    assert read_order_file(one) == [[4, 0, 2]]
    two = tmp_path / "two"          # recognised by content, not by name
    with open(two, "wb") as fh:
        np.save(fh, np.array([[1, 2, 3], [3, 2, 1]], dtype=np.int64))
    assert read_order_file(two) == [[1, 2, 3], [3, 2, 1]]
    assert all(type(i) is int for i in read_order_file(two)[0])
    for bad, message in ((np.array([0.5, 1.0]), "integers"), (np.zeros((2, 2, 2), dtype=int), "3-D"),
                         (np.array([1, -2]), "negative"), (np.array([], dtype=int), "empty")):
        p = tmp_path / "bad.npy"
        np.save(p, bad)
        with pytest.raises(OrderError, match=message):
            read_order_file(p)
    fake = tmp_path / "fake.npy"
    fake.write_text("1\n2\n")
    with pytest.raises(OrderError, match="numpy"):
        read_order_file(fake)



def npy_bytes(arr: np.ndarray) -> bytes:
    import io
    out = io.BytesIO()
    np.save(out, arr)
    return out.getvalue()


def damaged_npy() -> dict[str, bytes]:
    """.npy files as a damaged disk or a wrong writer leave them."""
    good = npy_bytes(np.array([0, 1, 2], np.int64))
    head = good[:good.index(b"}") + 1]
    return {
        "shape far beyond the file": good.replace(b"'shape': (3,), }", b"'shape': (9999999999,)}"),
        "shape of 2**62": good.replace(b"'shape': (3,), }", b"'shape': (4611686018427387904,)}"),
        "an expression for a shape": good.replace(b"'shape': (3,), }", b"'shape': (10**9,), }"),
        "a negative shape": good.replace(b"'shape': (3,), }", b"'shape': (3, -1),}"),
        "junk in the header": good[:10] + b"garbage" + good[17:],
        "a header cut short": good[:30],
        "values cut short": good[:-3],
        "more bytes than the shape": good + b"\0" * 8,
        "an unhashable key": head.replace(b"{'descr'", b"{[1]: 2, 'descr'") + good[len(head):],
        "objects": good.replace(b"'<i8'", b"'|O' "),
        "a version 9 header": good[:6] + b"\x09\x00" + good[8:],
        "unsigned values past int64": npy_bytes(np.array([0, 2**64 - 1], np.uint64)),
    }


@pytest.mark.parametrize("what", sorted(damaged_npy()))
def test_a_damaged_npy_order_file_is_a_clear_error(tmp_path: Path, what: str) -> None:
    p = tmp_path / "order.npy"
    p.write_bytes(damaged_npy()[what])
    with pytest.raises(OrderError, match=r"order file .*order\.npy: .*(damaged|cut short|object|version|too large)"):
        read_order_file(p)


@pytest.mark.parametrize("token", ["99999999999999999999999", "9" * 5000, str(2**63)])
def test_an_index_beyond_int64_is_a_clear_error(tmp_path: Path, token: str) -> None:
    p = tmp_path / "order.txt"
    p.write_text(f"0\n1\n{token}\n")
    with pytest.raises(OrderError, match=r"line 3: index [0-9]+(\.\.\.)? is too large"):
        read_order_file(p)
    p.write_text(f"0\n{2**63 - 1}\n{'0' * 5000}7\n")
    assert read_order_file(p) == [[0, 2**63 - 1, 7]]


def test_a_fortran_ordered_npy_order_file_is_read_in_its_order(tmp_path: Path) -> None:
    rows = np.array([[1, 2, 3], [3, 2, 1]], np.int64)
    p = tmp_path / "order.npy"
    np.save(p, np.asfortranarray(rows))
    assert b"'fortran_order': True" in p.read_bytes()
    assert read_order_file(p) == rows.tolist()


# ------------------------------------------------------------ ranks

def test_ranks_from_env_defaults() -> None:
    assert ranks_from_env({}) == (1, 0, 1, 0)


def test_ranks_from_env_torchrun() -> None:
    env = {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
    assert ranks_from_env(env) == (8, 5, 4, 1)
    del env["GROUP_RANK"]
    assert ranks_from_env(env) == (8, 5, 4, 1)
    # torchrun inside a Slurm allocation: torchrun's values are the training ranks
    env.update({"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_NODEID": "1"})
    assert ranks_from_env(env) == (8, 5, 4, 1)


def test_ranks_from_env_slurm() -> None:
    base = {"SLURM_NTASKS": "8", "SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NODEID": "1"}
    assert ranks_from_env({**base, "SLURM_NTASKS_PER_NODE": "4"}) == (8, 6, 4, 1)
    assert ranks_from_env({**base, "SLURM_TASKS_PER_NODE": "4(x2)"}) == (8, 6, 4, 1)
    uneven = {"SLURM_NTASKS": "7", "SLURM_PROCID": "6", "SLURM_NODEID": "3",
              "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert ranks_from_env(uneven) == (7, 6, 1, 3)
    assert parse_slurm_tasks_per_node("4(x2),3,1(x2)") == [4, 4, 3, 1, 1]
    with pytest.raises(OrderError, match="SLURM_TASKS_PER_NODE"):
        ranks_from_env({**base, "SLURM_TASKS_PER_NODE": "4x2"})
    with pytest.raises(OrderError, match="SLURM_NODEID"):
        ranks_from_env({**base, "SLURM_TASKS_PER_NODE": "4"})


def test_ranks_from_env_bad_values() -> None:
    with pytest.raises(OrderError, match="RANK"):
        ranks_from_env({"WORLD_SIZE": "4", "RANK": "two"})
    with pytest.raises(OrderError, match="inconsistent"):
        ranks_from_env({"WORLD_SIZE": "4", "RANK": "4"})


def test_local_ranks() -> None:
    assert local_ranks(1, 0, 1) == [0]
    assert local_ranks(8, 5, 4) == [4, 5, 6, 7]
    assert local_ranks(8, 3, 4) == [0, 1, 2, 3]
    assert local_ranks(6, 5, 4) == [4, 5]
    assert local_ranks(3, 2, 1) == [2]
    with pytest.raises(OrderError):
        local_ranks(4, 4, 2)
    with pytest.raises(OrderError):
        local_ranks(4, 0, 5)


@pytest.mark.parametrize("extra", (False, True))
@pytest.mark.parametrize("sampler", ("random", "distributed"))
def test_epochs_from_options_are_the_files_the_samples_read(tmp_path: Path, extra: bool, sampler: str) -> None:
    """Each epoch's catalog ids are those of the files its indices name in the
    ImageFolder layout: the orders themselves when index i is file i of the
    catalog, gathered through the layout when it is not (a file ImageFolder
    skips, sorted between the images)."""
    from tiering.catalog import scan
    from tiering.catalog.layout import dataset_ids
    from tiering.clairvoyant.options import OrderOptions, epoch_arrays_from_options, layout_of, rank_specs
    for c in range(3):
        (tmp_path / f"c{c}").mkdir()
        for k in range(7):
            (tmp_path / f"c{c}" / f"{k}.jpg").write_bytes(b"x")
    if extra:
        (tmp_path / "c1" / "3.txt").write_bytes(b"not an image")
    cat = scan([str(tmp_path)])
    opts = OrderOptions(sampler=sampler, seed=5, epochs=3, world_size=2 if sampler == "distributed" else None,
                        rank=1 if sampler == "distributed" else None,
                        local_world_size=1 if sampler == "distributed" else None)
    mapping = dataset_ids(cat, layout_of(opts))
    assert np.array_equal(mapping, np.arange(len(cat.files))) is not extra
    (spec,) = rank_specs(opts, {})
    got = [e.tolist() for e in epoch_arrays_from_options(opts, cat, {})]
    want = [[int(mapping[i]) for i in epoch_order(spec, len(mapping), e)] for e in range(3)]
    assert got == want and len(got[0]) == (11 if sampler == "distributed" else 21)
    names = {cat.files.rel(int(f)) for f in got[0]}
    assert not any(n.endswith(".txt") for n in names)


@pytest.mark.slow
def test_an_order_file_is_read_a_line_at_a_time(tmp_path: Path) -> None:
    """NOTE [order file memory]: the reading's Python allocations stay near
    8 bytes per entry, not the file's size several times over (its bytes,
    their text, a list of lines and a list of ints)."""
    import tracemalloc

    from tiering.clairvoyant.orderfile import read_order_arrays
    n = 200_000
    f = tmp_path / "order.txt"
    f.write_text("".join(f"/pfs/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG\n" for i in range(n)))
    size = f.stat().st_size
    tracemalloc.start()
    try:
        epochs = read_order_arrays(f, len)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [len(e) for e in epochs] == [n] and epochs[0].dtype == np.int64
    assert int(epochs[0][0]) == len("/pfs/imagenet/train/n00000000/n00000000_0.JPEG")
    assert peak < 3 * 8 * n and peak < size / 2    # the text alone is size bytes, its lines twice that


def test_an_order_file_through_a_pipe(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.write(w, b"3\n1\n\n2\n")
    os.close(w)
    try:
        assert read_order_file(Path(f"/dev/fd/{r}")) == [[3, 1], [2]]
    finally:
        os.close(r)


def _tree(root: Path) -> list[str]:
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for k in range(5):
            (root / f"c{c}" / f"{k}.jpg").write_bytes(b"x")
    return [f"c{c}/{k}.jpg" for c in range(2) for k in range(5)]


def _piped(path: Path, data: bytes, chunks: int = 1) -> Path:
    """A FIFO at path that a thread writes data into, in `chunks` writes."""
    import threading
    os.mkfifo(path)

    def write() -> None:
        try:
            with open(path, "wb") as f:
                step = -(-len(data) // chunks)
                for k in range(0, len(data), step):
                    f.write(data[k:k + step])
                    f.flush()
        except BrokenPipeError:   # the reader refused it and closed its end
            pass
    threading.Thread(target=write, daemon=True).start()
    return path


@pytest.mark.parametrize("kind", ["paths", "indices"])
def test_an_order_file_through_a_fifo_is_read_once_and_whole(tmp_path: Path, kind: str) -> None:
    """A path file longer than a read's buffer, through a FIFO: every entry,
    none lost to a first pass that told paths from indices."""
    from tiering.catalog import scan
    from tiering.clairvoyant.options import OrderOptions, epoch_arrays_from_options
    rels = _tree(tmp_path / "ds")
    cat = scan([str(tmp_path / "ds")])
    ids = {cat.files.rel(i): i for i in range(len(cat.files))}
    n = 1200
    entries = [rels[k % len(rels)] for k in range(n)] if kind == "paths" else [str(k % len(rels)) for k in range(n)]
    data = "".join(f"      {e}\n" for e in entries).encode()
    fifo = _piped(tmp_path / "order", data, chunks=7)
    got = [e.tolist() for e in epoch_arrays_from_options(OrderOptions(order_file=fifo), cat, {})]
    want = [ids[e] for e in entries] if kind == "paths" else [k % len(rels) for k in range(n)]
    assert got == [want]


def test_a_npy_order_file_through_a_pipe_is_a_clear_error(tmp_path: Path) -> None:
    import io
    buf = io.BytesIO()
    np.save(buf, np.arange(4))
    fifo = _piped(tmp_path / "order", buf.getvalue(), chunks=3)   # the magic in pieces
    with pytest.raises(OrderError, match="through a pipe.*save it"):
        read_order_file(fifo)


def test_a_path_order_file_keeps_neither_its_path_index_nor_the_epochs_handed_over(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """NOTE [order file memory]: once a file of paths is read, the PathIndex
    (16 B a catalogued file) is let go, and an epoch the policy has taken is
    not held by the generator as well (8 B a position each)."""
    import gc
    import weakref

    from tiering.catalog import scan
    from tiering.clairvoyant import options
    rels = _tree(tmp_path / "ds")
    cat = scan([str(tmp_path / "ds")])
    made: list[weakref.ref] = []

    class Tracked(options.PathIndex):
        def __init__(self, catalog) -> None:
            super().__init__(catalog)
            made.append(weakref.ref(self))
    monkeypatch.setattr(options, "PathIndex", Tracked)
    f = tmp_path / "order.txt"
    f.write_text("\n".join(rels) + "\n\n" + "\n".join(reversed(rels)) + "\n")
    ids = {cat.files.rel(i): i for i in range(len(cat.files))}
    gen = options.epoch_arrays_from_options(options.OrderOptions(order_file=f), cat, {})
    first = next(gen)
    gc.collect()
    assert len(made) == 1 and made[0]() is None
    assert first.tolist() == [ids[r] for r in rels]
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is None           # the generator (one epoch still to hand over) does not hold it
    assert next(gen).tolist() == [ids[r] for r in reversed(rels)]
    assert next(gen, None) is None
