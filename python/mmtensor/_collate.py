"""collate functions that let PyTorch's DataLoader batch mmtensor samples.

torch.utils.data.DataLoader(dataset, batch_size=...) hands each batch's list of samples to a
collate_fn. Its default_collate knows torch tensors, NumPy arrays and numbers, not
mmtensor.Tensor, so a Dataset given to a DataLoader needs one of these:

    loader = DataLoader(mmtensor.Dataset("train.mmt"), batch_size=64, shuffle=True,
                        num_workers=4, collate_fn=mmtensor.collate_torch, pin_memory=True)

Both return {field: value} in the dataset's field order, plus "index" (the records'
indices in their Dataset, int64) unless a field has that name. (mmtensor.Dataset([a, b])
numbers records across its files; torch's ConcatDataset of two Datasets does not, so there
"index" is each record's index in its own file.) Samples must share one schema. A
fixed-shape field becomes one [B, ...] array copied once from the samples' views
(contiguous, writable, its own memory: safe to keep across steps and to modify). A ragged
field becomes a list of B arrays, each a copy (a batch of sequences of different lengths is
the caller's to pad or pack).

mmtensor.Loader does the same work without Python in the loop (C++ threads gather straight
into pinned memory) and is the fast path; these are for code built around DataLoader.
"""
import numpy as np

from ._mmtensor import Sample

__all__ = ["collate", "collate_torch"]


def _checked(samples):
    samples = list(samples)
    if not samples:
        raise ValueError("collate: no samples to collate")
    for k, sample in enumerate(samples):
        if not isinstance(sample, Sample):
            # A Sample sent through pickle (a DataLoader's batch_sampler=None path, a queue)
            # arrives as a dict of its tensors, without the schema this needs.
            raise TypeError(f"collate: sample {k} is a {type(sample).__name__}, not an mmtensor.Sample (a pickled "
                            "Sample becomes a dict of its tensors: collate where the samples are read, in the "
                            "DataLoader's worker, as collate_fn does)")
    fields = samples[0].fields
    for k, sample in enumerate(samples[1:], start=1):
        if sample.fields != fields:  # name, dtype, shape and layout: a batch has one of each
            raise ValueError(f"collate: sample {k} (record {sample.index}) has fields {sample.fields}, "
                             f"sample 0 (record {samples[0].index}) has {fields}: samples of datasets with "
                             "one schema only")
    return samples, fields


def _stack(samples, name):
    """A fixed field of every sample (one shape and dtype: _checked) as one new array."""
    first = np.asarray(samples[0][name])
    out = np.empty((len(samples),) + first.shape, dtype=first.dtype)
    for row, sample in enumerate(samples):
        # mmtensor's copy, not NumPy's: a file cut short under the reader is an OSError
        # naming it, where NumPy reading the mapping would end the process with SIGBUS.
        sample[name]._copy_into(out[row, ...])  # [row, ...]: a view, also of a 0-d row
    return out


def _copy(value):
    """A value as a new NumPy array of its own, copied by mmtensor (see _stack)."""
    out = np.empty(value.shape, dtype=np.asarray(value).dtype)
    value._copy_into(out)
    return out


def _unbatched(batch):
    """The one row of a batch of one sample: what DataLoader(batch_size=None) hands on."""
    return {name: value[0] for name, value in batch.items()}


def collate(samples):
    """A list of mmtensor.Sample as one batch of NumPy arrays (see the module's doc). A single
    Sample (DataLoader(batch_size=None) passes them one at a time) comes back as its own
    arrays, without the batch dimension. A bfloat16 field, which NumPy has no type for, is
    refused: collate_torch takes it."""
    if isinstance(samples, Sample):
        return _unbatched(collate([samples]))
    samples, fields = _checked(samples)
    for field in fields:
        if field.dtype == "bfloat16":
            raise TypeError(f"collate: field '{field.name}' is bfloat16, which NumPy has no type for; "
                            "use mmtensor.collate_torch")
    batch = {}
    for field in fields:
        if field.is_fixed:
            batch[field.name] = _stack(samples, field.name)
        else:
            batch[field.name] = [_copy(sample[field.name]) for sample in samples]
    batch.setdefault("index", np.array([sample.index for sample in samples], dtype=np.int64))
    return batch


def collate_torch(samples):
    """A list of mmtensor.Sample as one batch of torch CPU tensors (see the module's doc); a
    single Sample as its own tensors, as collate does. bfloat16 fields, which NumPy has no
    type for, come through DLPack."""
    import torch

    if isinstance(samples, Sample):
        return _unbatched(collate_torch([samples]))
    samples, fields = _checked(samples)
    batch = {}
    for field in fields:
        name = field.name
        if field.dtype == "bfloat16":
            values = [torch.from_dlpack(sample[name]) for sample in samples]
            batch[name] = torch.stack(values) if field.is_fixed else [v.clone() for v in values]
        elif field.is_fixed:
            batch[name] = torch.from_numpy(_stack(samples, name))
        else:
            batch[name] = [torch.from_numpy(_copy(sample[name])) for sample in samples]
    batch.setdefault("index", torch.tensor([sample.index for sample in samples], dtype=torch.int64))
    return batch
