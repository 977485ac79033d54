"""torch.utils.data: datasets, samplers, and a DataLoader that batches host tensors, for a
tutorial's loop (`for X, y in DataLoader(TensorDataset(X, Y), batch_size=64, shuffle=True)`).

Each is torch's, run in this process: batches are collated as torch's default_collate collates
(tensors and numpy arrays stacked, Python floats float64 and ints int64 tensors, strings kept in
lists, tuples, lists, dicts and namedtuples collated field by field); len() and drop_last as torch's.
num_workers, pin_memory, prefetch_factor and persistent_workers are taken and change nothing (the
loading runs here; a compiled step is where the time goes). Shuffling draws from Mica's generator
(mica.manual_seed, or the generator= given), so an order repeats from a seed, but it is not the
order torch's generator would draw.
"""
import bisect
import collections.abc
import itertools
import math

import numpy as np

from ..errors import MicaError


def _say(text):
    from ..tensor import user_location

    return MicaError(text, user_location())


# ------------------------------------------------------------------------------------- datasets

class Dataset:
    """torch's map-style dataset: __getitem__(i) and __len__; `a + b` concatenates."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """torch's iterable dataset: __iter__ gives the samples (no sampler, no shuffle)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")

    def __add__(self, other):
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    """Samples are the tensors' rows: dataset[i] = (t[i] for t in tensors)."""

    def __init__(self, *tensors):
        sizes = {len(t) for t in tensors}
        if len(sizes) > 1:
            raise _say(f"TensorDataset: the tensors hold {sorted(sizes)} rows; give tensors of one first size "
                       "(as torch's: Size mismatch between tensors)")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return len(self.tensors[0]) if self.tensors else 0


class StackDataset(Dataset):
    """torch's: samples are tuples (or dicts) of the datasets' samples at one index."""

    def __init__(self, *args, **kwargs):
        if args and kwargs:
            raise _say("StackDataset takes datasets as positional or as keyword arguments, not both")
        self.datasets = args or kwargs
        lengths = {len(d) for d in (args or kwargs.values())}
        if len(lengths) > 1:
            raise _say(f"StackDataset: the datasets hold {sorted(lengths)} samples; give datasets of one length")
        self._length = lengths.pop() if lengths else 0

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self):
        return self._length


class ConcatDataset(Dataset):
    """torch's: the datasets one after another."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise _say("ConcatDataset takes at least one dataset")
        if any(isinstance(d, IterableDataset) for d in self.datasets):
            raise _say("ConcatDataset takes map-style datasets; chain iterable ones with ChainDataset")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, index):
        if index < 0:
            if -index > len(self):
                raise IndexError("absolute value of index should not exceed dataset length")
            index += len(self)
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][index - start]


class ChainDataset(IterableDataset):
    def __init__(self, datasets):
        self.datasets = list(datasets)

    def __iter__(self):
        for d in self.datasets:
            yield from d

    def __len__(self):
        return sum(len(d) for d in self.datasets)


class Subset(Dataset):
    """torch's: the dataset at the given indices."""

    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, [int(i) for i in np.asarray(indices).reshape(-1)] \
            if not isinstance(indices, list) else indices

    def __getitem__(self, index):
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]
        return self.dataset[self.indices[index]]

    def __len__(self):
        return len(self.indices)


def random_split(dataset, lengths, generator=None):
    """torch's: non-overlapping Subsets of the given lengths (or fractions summing to 1, the
    remainder spread one at a time from the first), in an order drawn from the generator."""
    from .. import randperm

    n = len(dataset)
    lengths = list(lengths)
    if lengths and math.isclose(sum(lengths), 1) and sum(lengths) <= 1 and all(0 <= f <= 1 for f in lengths) and \
            not all(isinstance(f, int) for f in lengths):
        counts = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        lengths = counts
    if sum(lengths) != n:
        raise _say(f"random_split: the lengths sum to {sum(lengths)}, the dataset holds {n} samples; give lengths "
                   "that sum to its length (or fractions that sum to 1)")
    order = [int(i) for i in np.asarray(randperm(n, generator=generator))]
    out, start = [], 0
    for length in lengths:
        out.append(Subset(dataset, order[start:start + length]))
        start += length
    return out


# ------------------------------------------------------------------------------------- samplers

class Sampler:
    """torch's base: __iter__ gives indices."""

    def __init__(self, data_source=None):
        pass


class SequentialSampler(Sampler):
    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """torch's: a permutation per pass (or num_samples draws with replacement)."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source, self.replacement, self._num_samples, self.generator = \
            data_source, replacement, num_samples, generator
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples <= 0):
            raise _say(f"RandomSampler: num_samples should be a positive integer, got {num_samples!r}")

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        from .. import randint, randperm

        n = len(self.data_source)
        if n == 0:  # (an empty dataset: no samples, not a division by zero)
            return
        if self.replacement:
            yield from (int(i) for i in np.asarray(randint(0, n, (self.num_samples,), generator=self.generator)))
            return
        for _ in range(self.num_samples // n):
            yield from (int(i) for i in np.asarray(randperm(n, generator=self.generator)))
        yield from (int(i) for i in np.asarray(randperm(n, generator=self.generator))[:self.num_samples % n])

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    def __init__(self, indices, generator=None):
        self.indices, self.generator = indices, generator

    def __iter__(self):
        from .. import randperm

        for i in np.asarray(randperm(len(self.indices), generator=self.generator)):
            yield self.indices[int(i)]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    def __init__(self, weights, num_samples, replacement=True, generator=None):
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise _say(f"WeightedRandomSampler: num_samples should be a positive integer, got {num_samples!r}")
        self.weights = np.asarray(weights, np.float64).reshape(-1)
        self.num_samples, self.replacement, self.generator = num_samples, replacement, generator

    def __iter__(self):
        from .. import multinomial, tensor

        drawn = multinomial(tensor(self.weights), self.num_samples, self.replacement, generator=self.generator)
        return iter(int(i) for i in np.asarray(drawn))

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """torch's: the sampler's indices in lists of batch_size (the last shorter unless drop_last)."""

    def __init__(self, sampler, batch_size, drop_last):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise _say(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, bool(drop_last)

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


# ------------------------------------------------------------------------------------- collation

def default_collate(batch):
    """torch's default_collate: a list of samples into one batch."""
    from .. import stack, tensor
    from ..dtypes import float64, int64
    from ..host import HostTensor, host

    first = batch[0]
    if isinstance(first, np.ndarray) and not (first.dtype.kind in "USO"):
        return stack([x if isinstance(x, HostTensor) else host(np.asarray(x)) for x in batch])
    if type(first).__name__ == "Parameter":
        return stack([np.asarray(x) for x in batch])
    if is_torch(first):
        return stack([host(x.detach().numpy()) for x in batch])
    if isinstance(first, np.generic):
        return host(np.array(batch))
    if isinstance(first, bool):
        return tensor(batch)
    if isinstance(first, float):
        return tensor(batch, dtype=float64)
    if isinstance(first, int):
        return tensor(batch, dtype=int64)
    if isinstance(first, (str, bytes)):
        return list(batch)
    if isinstance(first, collections.abc.Mapping):
        return {k: default_collate([d[k] for d in batch]) for k in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # (a namedtuple)
        return type(first)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(first, collections.abc.Sequence):
        if any(len(s) != len(first) for s in batch):
            raise _say("default_collate: each element in list of batch should be of equal size")
        return [default_collate(list(s)) for s in zip(*batch)]  # (a list for tuples too, as torch's)
    raise _say(f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found "
               f"{type(first).__name__} (give DataLoader a collate_fn)")


def default_convert(data):
    """torch's default_convert: numpy arrays to tensors, inside containers too (no batching)."""
    from ..host import host

    if isinstance(data, np.ndarray) and data.dtype.kind not in "USO":
        return host(data)
    if isinstance(data, collections.abc.Mapping):
        return {k: default_convert(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, np.generic):
        return host(np.asarray(data))
    if isinstance(data, (list, tuple)):
        return [default_convert(d) for d in data]  # (a list for tuples too, as torch's)
    return data


def is_torch(x):
    from ..host import is_torch_tensor

    return is_torch_tensor(x)


# ------------------------------------------------------------------------------------- the loader

class DataLoader:
    """torch's DataLoader, loading in this process."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True):
        if not isinstance(num_workers, int) or num_workers < 0:
            raise _say(f"DataLoader: num_workers must be an int >= 0, got {num_workers!r}")
        self.dataset, self.num_workers, self.generator = dataset, num_workers, generator
        self.pin_memory, self.timeout, self.worker_init_fn = pin_memory, timeout, worker_init_fn
        self._iterable = isinstance(dataset, IterableDataset) or (
            hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__"))
        if self._iterable and (shuffle or sampler is not None or batch_sampler is not None):
            raise _say("DataLoader: an iterable dataset gives its samples in its own order; leave shuffle, sampler "
                       "and batch_sampler unset (as torch's)")
        if sampler is not None and shuffle:
            raise _say("DataLoader: sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise _say("DataLoader: batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                       "and drop_last")
        if batch_size is None and drop_last:
            raise _say("DataLoader: batch_size=None option disables auto-batching and is mutually exclusive with "
                       "drop_last")
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or
                                       batch_size <= 0):
            raise _say(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}")
        if sampler is None and not self._iterable:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_sampler is not None:  # (its batches as given: torch's batch_size None)
            batch_size, drop_last = None, False
        elif batch_size is not None and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last, self.sampler, self.batch_sampler = drop_last, sampler, batch_sampler
        self.collate_fn = collate_fn if collate_fn is not None else \
            default_collate if batch_sampler is not None or batch_size is not None else default_convert

    def __iter__(self):
        if self.worker_init_fn is not None and self.num_workers > 0:
            self.worker_init_fn(0)
        if self._iterable:
            samples = iter(self.dataset)
            if self.batch_size is None:
                yield from (self.collate_fn(s) for s in samples)
                return
            while True:
                batch = list(itertools.islice(samples, self.batch_size))
                if not batch or (self.drop_last and len(batch) < self.batch_size):
                    return
                yield self.collate_fn(batch)
        if self.batch_sampler is None:
            for i in self.sampler:
                yield self.collate_fn(self.dataset[i])
            return
        getitems = getattr(self.dataset, "__getitems__", None)
        for indices in self.batch_sampler:
            yield self.collate_fn(getitems(indices) if getitems else [self.dataset[i] for i in indices])

    def __len__(self):
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self.batch_sampler) if self.batch_sampler is not None else len(self.sampler)


def get_worker_info():
    """torch's: None in the main process, where Mica's loader runs."""
    return None
