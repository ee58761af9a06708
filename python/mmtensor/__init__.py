"""mmtensor: memory-mapped datasets for ML training.

The Python face of the C++ engine (include/mmtensor/). A dataset's fields come back as
mmtensor.Tensor views, straight into the mapped file when uncompressed; they reach NumPy
(t.numpy(), np.asarray(t)) and PyTorch (torch.from_dlpack(t)) without a copy.

    import mmtensor
    ds = mmtensor.Dataset("train.mmt")
    ds[0]["image"].numpy()                      # read-only view into the file
    loader = mmtensor.Loader(ds, batch_size=256, sampler="random", seed=7, num_workers=2)
    for batch in loader:                        # one epoch
        images = batch["image"].numpy()         # [256, ...], valid while `images` lives

torch.utils.data.DataLoader takes a Dataset with collate_fn=mmtensor.collate_torch (or
mmtensor.collate for NumPy arrays); mmtensor.Loader is the fast path.

Errors: IndexError, ValueError, KeyError (an unknown field of a sample or batch), OSError with its errno
(FileNotFoundError, TimeoutError...), and mmtensor.FormatError / ChecksumError / CudaError,
which derive from mmtensor.Error.
"""
from collections.abc import Mapping as _Mapping

from ._mmtensor import (  # noqa: F401
    Batch,
    ChecksumError,
    CudaError,
    Dataset,
    DatasetWriter,
    Error,
    Field,
    FormatError,
    Loader,
    RaggedBatch,
    Sample,
    Tensor,
    Transform,
    __version__,
    concat,
    cuda_is_available,
    pack,
)
from ._collate import collate, collate_torch  # noqa: F401
from ._shards import write_shards  # noqa: F401

# A Sample and a Batch are read-only mappings of field name to value: dict(sample) works,
# and isinstance(sample, Mapping) holds.
_Mapping.register(Sample)
_Mapping.register(Batch)

__all__ = [
    "Batch", "ChecksumError", "CudaError", "Dataset", "DatasetWriter", "Error", "Field",
    "FormatError", "Loader", "RaggedBatch", "Sample", "Tensor", "Transform", "collate", "collate_torch", "concat",
    "cuda_is_available", "pack", "write_shards",
]


def _rebuild_tensor(data, dtype, shape, device):
    """Rebuilds a pickled Tensor (Tensor.__reduce__ names this function: pickle cannot name a
    function of the compiled module)."""
    from ._mmtensor import _tensor_from_bytes
    return _tensor_from_bytes(data, dtype, shape, device)
