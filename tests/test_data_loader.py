"""mica.utils.data (torch.utils.data) against torch 2.13: the Quickstart tutorial's
`DataLoader(TensorDataset(X, y), batch_size=...)` loop, collation of every kind of sample, lengths,
drop_last, samplers, random_split, ConcatDataset and Subset, iterable datasets. Batches in order are
torch's exactly; shuffled ones are a permutation drawn from Mica's generator (repeatable from a
seed, not torch's order)."""
import collections

import numpy as np
import pytest

import mica
from mica.utils import data as mdata

torch = pytest.importorskip("torch")
tdata = torch.utils.data


def _arr(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _same(a, b):
    """Two collated batches: the same structure, types and values."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, mica.Tensor) and str(b.dtype) == f"torch.{np.asarray(a).dtype}", (type(a), b.dtype)
        np.testing.assert_array_equal(_arr(a), _arr(b))
    elif isinstance(b, dict):
        assert list(a) == list(b)
        for k in b:
            _same(a[k], b[k])
    elif isinstance(b, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (type(a), type(b))
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


Point = collections.namedtuple("Point", "x label")


class Samples:
    """A map-style dataset of mixed samples (not a Dataset subclass: torch takes any __getitem__)."""

    def __init__(self, lib, n):
        rng = np.random.default_rng(0)
        self.lib, self.rows = lib, rng.standard_normal((n, 3)).astype(np.float32)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.lib.tensor(self.rows[i])
        return {"x": row, "n": i, "w": float(i) / 3, "name": f"s{i}", "pair": (row * 2, i % 2),
                "point": Point(self.rows[i], True)}


@pytest.mark.parametrize("batch_size,drop_last", [(4, False), (4, True), (1, False), (10, False)])
def test_batches_in_order_are_torchs(batch_size, drop_last):
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((10, 2, 3)).astype(np.float32), rng.integers(0, 5, 10)
    ours = mdata.DataLoader(mdata.TensorDataset(mica.tensor(X), mica.tensor(y)), batch_size=batch_size,
                            drop_last=drop_last)
    theirs = tdata.DataLoader(tdata.TensorDataset(torch.tensor(X), torch.tensor(y)), batch_size=batch_size,
                              drop_last=drop_last)
    assert len(ours) == len(theirs)
    got, want = list(ours), list(theirs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        _same(a, b)
    for a, b in zip(mdata.DataLoader(Samples(mica, 7), batch_size=3), tdata.DataLoader(Samples(torch, 7), batch_size=3)):
        _same(a, b)
    for a, b in zip(mdata.DataLoader(Samples(mica, 3), batch_size=None), tdata.DataLoader(Samples(torch, 3),
                                                                                          batch_size=None)):
        _same(a, b)


def test_shuffled_batches_are_a_permutation_repeated_from_a_seed():
    X = np.arange(23, dtype=np.float32)
    loader = mdata.DataLoader(mdata.TensorDataset(mica.tensor(X)), batch_size=5, shuffle=True)
    mica.manual_seed(3)
    first = np.concatenate([np.asarray(b[0]) for b in loader])
    second = np.concatenate([np.asarray(b[0]) for b in loader])
    assert sorted(first) == list(X) and sorted(second) == list(X) and not np.array_equal(first, second)
    mica.manual_seed(3)
    np.testing.assert_array_equal(np.concatenate([np.asarray(b[0]) for b in loader]), first)
    g = mica.Generator()
    g.manual_seed(7)
    a = [np.asarray(b[0]) for b in mdata.DataLoader(mdata.TensorDataset(mica.tensor(X)), batch_size=5, shuffle=True,
                                                    generator=g)]
    assert sorted(np.concatenate(a)) == list(X) and [len(b) for b in a] == [5, 5, 5, 5, 3]


def test_the_quickstart_loop_trains_as_torchs_from_the_same_batches():
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((20, 1, 4, 4)).astype(np.float32), rng.integers(0, 3, 20)
    nets = []
    for lib in (torch, mica):
        lib.manual_seed(0)
        nets.append(lib.nn.Sequential(lib.nn.Flatten(), lib.nn.Linear(16, 8), lib.nn.ReLU(), lib.nn.Linear(8, 3)))
    tnet, mnet = nets
    mnet.load_state_dict({k: mica.tensor(v.numpy()) for k, v in tnet.state_dict().items()})
    topt, mopt = torch.optim.SGD(tnet.parameters(), lr=0.1), mica.optim.SGD(mnet.parameters(), lr=0.1)
    loss_fn = mica.nn.CrossEntropyLoss()

    @mica.compile
    def step(xb, yb):
        loss = loss_fn(mnet(xb), yb)
        loss.backward()
        mopt.step()
        mopt.zero_grad()
        return loss

    ours = mdata.DataLoader(mdata.TensorDataset(mica.tensor(X), mica.tensor(y)), batch_size=8)
    theirs = tdata.DataLoader(tdata.TensorDataset(torch.tensor(X), torch.tensor(y)), batch_size=8)
    for (xb, yb), (tx, ty) in zip(ours, theirs):
        loss = torch.nn.functional.cross_entropy(tnet(tx), ty)
        loss.backward()
        topt.step()
        topt.zero_grad()
        np.testing.assert_allclose(float(step(xb, yb)), float(loss), rtol=1e-5)
    correct = sum((mnet(xb).argmax(1) == yb).type(mica.float).sum().item() for xb, yb in ours)
    assert correct == sum((tnet(tx).argmax(1) == ty).type(torch.float).sum().item() for tx, ty in theirs)


def test_samplers_splits_concatenation_and_iterable_datasets_are_torchs():
    base = mdata.TensorDataset(mica.arange(10))
    parts = mdata.random_split(base, [0.5, 0.3, 0.2])
    assert [len(p) for p in parts] == [len(p) for p in tdata.random_split(range(10), [0.5, 0.3, 0.2])]
    assert sorted(int(p[i][0]) for p in parts for i in range(len(p))) == list(range(10))
    assert [len(p) for p in mdata.random_split(range(7), [0.5, 0.5])] == [4, 3]  # (the remainder from the first)
    with pytest.raises(mica.MicaError, match="lengths sum to 9"):
        mdata.random_split(base, [4, 5])
    both = mdata.ConcatDataset([range(3), range(10, 14)])
    assert len(both) == 7 and [both[i] for i in (0, 3, -1)] == [0, 10, 13]
    sub = mdata.Subset(range(100), [5, 7, 9])
    assert [sub[i] for i in range(len(sub))] == [5, 7, 9]
    batches = mdata.BatchSampler(mdata.SequentialSampler(range(7)), 3, drop_last=False)
    assert list(batches) == list(tdata.BatchSampler(tdata.SequentialSampler(range(7)), 3, False)) and len(batches) == 3
    weighted = list(mdata.WeightedRandomSampler([0.0, 1.0, 0.0, 3.0], 20))
    assert len(weighted) == 20 and set(weighted) <= {1, 3}
    with_replacement = list(mdata.RandomSampler(range(4), replacement=True, num_samples=9))
    assert len(with_replacement) == 9 and set(with_replacement) <= set(range(4))

    class Stream(mdata.IterableDataset):
        def __iter__(self):
            return iter(range(7))

    class TorchStream(tdata.IterableDataset):
        def __iter__(self):
            return iter(range(7))

    for drop in (False, True):
        got = list(mdata.DataLoader(Stream(), batch_size=3, drop_last=drop))
        want = list(tdata.DataLoader(TorchStream(), batch_size=3, drop_last=drop))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _same(a, b)
    with pytest.raises(mica.MicaError, match="batch_size should be a positive integer value"):
        mdata.DataLoader(base, batch_size=0)
    with pytest.raises(mica.MicaError, match="sampler option is mutually exclusive with shuffle"):
        mdata.DataLoader(base, sampler=mdata.SequentialSampler(base), shuffle=True)
    with pytest.raises(mica.MicaError, match="hold \\[2, 3\\] rows"):
        mdata.TensorDataset(mica.zeros(2), mica.zeros(3))
