#!/usr/bin/env python3
"""The peer of BM_LoaderToDevice: PyTorch's DataLoader(pin_memory=True) over a numpy memmap.

Writes N records of uint8 [3, 224, 224] (the shape, count and batch size BM_LoaderToDevice
uses) to a .npy file, then times epochs of a shuffled DataLoader whose batches are moved to
the GPU with .cuda(non_blocking=True), as a training loop does. Prints one JSON line:
  {"peer": "torch_dataloader_memmap", "batches_per_s": ..., "GB_per_s": ..., ...}
Compare batches_per_s with mmtensor_bench's BM_LoaderToDevice batches_per_s (target: 3x).
Runs where torch is installed; without CUDA it times host batches and says so.

With --with-mmtensor (the mmtensor Python module on PYTHONPATH, e.g. build/python), the same
records are also packed into an uncompressed .mmt and read by mmtensor.Loader with as many
worker threads, its batches reaching torch through DLPack (on the GPU with CUDA: the loader
copies them itself), the two loaders' epochs alternated; the line then also holds
"mmtensor_batches_per_s", "mmtensor_GB_per_s" and "mmtensor_vs_peer"; with CUDA, also
"pinned_memcpy_GB_per_s" (pinned host-to-device copies of as many batches, timed after each
mmtensor epoch) and "mmtensor_vs_pinned_memcpy".
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np


class MemmapImages:
    """Map-style dataset: record i of a [N, 3, 224, 224] uint8 .npy opened with mmap."""

    def __init__(self, path):
        self.path = path
        self.images = None  # opened lazily in each worker process
        self.length = np.load(path, mmap_mode="r").shape[0]

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        import torch
        if self.images is None:
            self.images = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(np.ascontiguousarray(self.images[index])), index % 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write the .npy (default: a temp dir)")
    parser.add_argument("--with-mmtensor", action="store_true",
                        help="also time mmtensor.Loader on the same records, epochs alternated")
    parser.add_argument("--pin-mapping", action="store_true",
                        help="mmtensor.Loader with pin_mapping=True: records copied to the GPU from the "
                             "page-locked file mapping, no host gather (with --with-mmtensor, on a GPU)")
    args = parser.parse_args()
    workdir = args.dir or tempfile.mkdtemp(prefix="mmtensor-peer-")
    try:
        run(args, workdir)
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)  # 1.2 GB of records


def run(args, workdir):
    import torch
    from torch.utils.data import DataLoader

    path = os.path.join(workdir, "images.npy")
    shape = (args.records, 3, 224, 224)
    if os.path.exists(path) and np.load(path, mmap_mode="r").shape != shape:
        os.remove(path)  # a --dir reused with another --records
    if not os.path.exists(path):
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=shape)
        pattern = np.arange(3 * 224 * 224, dtype=np.int64)
        for i in range(args.records):  # the same pattern BM_LoaderToDevice writes
            out[i] = ((i * 31 + pattern) & 0xFF).astype(np.uint8).reshape(3, 224, 224)
        out.flush()
        del out

    cuda = torch.cuda.is_available()
    loader = DataLoader(MemmapImages(path), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, pin_memory=cuda, persistent_workers=args.workers > 0,
                        generator=torch.Generator().manual_seed(0))

    def epoch():
        batches = 0
        for images, labels in loader:
            if cuda:
                images = images.cuda(non_blocking=True)
                labels = labels.cuda(non_blocking=True)
            batches += 1
        if cuda:
            torch.cuda.synchronize()
        return batches

    mmtensor_epoch = mmtensor_epochs(args, workdir, path, cuda) if args.with_mmtensor else None

    batch_bytes = args.batch_size * (3 * 224 * 224 + 8)
    copy_batches = pinned_copies(batch_bytes) if cuda and mmtensor_epoch else None
    epoch()  # warm: page cache, worker processes, CUDA context
    if mmtensor_epoch:
        mmtensor_epoch()
    if copy_batches:
        copy_batches(8)
    seconds = mmtensor_seconds = copy_seconds = 0.0
    batches = mmtensor_batches = 0
    for _ in range(args.epochs):  # alternated, so that drift on a shared machine hits both
        start = time.perf_counter()
        batches += epoch()
        seconds += time.perf_counter() - start
        if mmtensor_epoch:
            start = time.perf_counter()
            epoch_batches = mmtensor_epoch()
            mmtensor_batches += epoch_batches
            mmtensor_seconds += time.perf_counter() - start
            if copy_batches:  # the reference: as many pinned batch copies, right after
                start = time.perf_counter()
                copy_batches(epoch_batches)
                copy_seconds += time.perf_counter() - start
    result = {
        "peer": "torch_dataloader_memmap",
        "device": "cuda" if cuda else "cpu (no CUDA: host batches only)",
        "records": args.records, "batch_size": args.batch_size, "workers": args.workers,
        "batches_per_s": batches / seconds,
        "GB_per_s": batches * batch_bytes / seconds / 1e9,
        "torch": torch.__version__,
    }
    if mmtensor_epoch:
        result["mmtensor_batches_per_s"] = mmtensor_batches / mmtensor_seconds
        result["mmtensor_GB_per_s"] = mmtensor_batches * batch_bytes / mmtensor_seconds / 1e9
        result["mmtensor_vs_peer"] = result["mmtensor_batches_per_s"] / result["batches_per_s"]
        result["mmtensor_pin_mapping"] = bool(cuda and args.pin_mapping)
    if copy_batches:
        result["pinned_memcpy_GB_per_s"] = mmtensor_batches * batch_bytes / copy_seconds / 1e9
        result["mmtensor_vs_pinned_memcpy"] = result["mmtensor_GB_per_s"] / result["pinned_memcpy_GB_per_s"]
    print(json.dumps(result))


def pinned_copies(batch_bytes):
    """The loader's bound: pinned host-to-device copies of one batch's bytes, queued back to
    back on one stream (as BM_LoaderToDevice's reference); returns a function that makes n of
    them and waits for them."""
    import torch
    source = torch.full((batch_bytes,), 1, dtype=torch.uint8).pin_memory()
    target = torch.empty(batch_bytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()

    def copy(n):
        with torch.cuda.stream(stream):
            for _ in range(n):
                target.copy_(source, non_blocking=True)
        stream.synchronize()

    return copy


def mmtensor_epochs(args, workdir, images_path, cuda):
    """Packs the records (and the peer's labels, index % 1000) once; returns a function that
    runs one shuffled epoch of mmtensor.Loader and returns its batch count."""
    import torch
    import mmtensor

    labels_path = os.path.join(workdir, "labels.npy")
    np.save(labels_path, np.arange(args.records, dtype=np.int64) % 1000)
    packed = os.path.join(workdir, "images.mmt")
    if os.path.exists(packed) and len(mmtensor.Dataset(packed)) != args.records:
        os.remove(packed)  # a --dir reused with another --records
    if not os.path.exists(packed):
        mmtensor.pack(packed, {"image": images_path, "label": labels_path})
    dataset = mmtensor.Dataset(packed)
    loader = mmtensor.Loader(dataset, batch_size=args.batch_size, sampler="random", seed=0,
                             num_workers=max(1, args.workers), device="cuda:0" if cuda else "cpu",
                             pin_mapping=bool(cuda and args.pin_mapping))
    epoch_number = [0]

    def epoch():
        # Every other epoch: the loader prefetches the epoch after the one it finished while
        # the peer's epoch runs, and timing that one would count those batches as free. A
        # jump restarts it from an empty ring, as the peer starts.
        loader.set_epoch(epoch_number[0])
        epoch_number[0] += 2
        batches = 0
        for batch in loader:
            images = torch.from_dlpack(batch["image"])
            labels = torch.from_dlpack(batch["label"])
            del images, labels
            batches += 1
        if cuda:
            torch.cuda.synchronize()
        return batches

    return epoch


if __name__ == "__main__":
    main()
