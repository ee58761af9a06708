#!/usr/bin/env python3
"""What the Python API costs: mmtensor's Loader and get_batch called from Python, against
the same gather in C++ terms (one get_batch per batch, the GIL released) and against what a
NumPy user writes (fancy indexing of np.load(mmap_mode="r")), all in one run on the same
file, indices and batch size, page cache warm.

    PYTHONPATH=build/python python3 bench/python_api.py [--records-784 N] [--records-150k N]

Prints one JSON line per record size with batches/s and GB/s of each reader, and the ratios:
  loader_vs_get_batch_all_cores  the Python Loader (its workers gather, and next() helps) /
                                 get_batch on as many threads as the machine has cores
  get_batch_vs_memcpy            get_batch on one thread / np.copyto of as many contiguous bytes
  numpy_vs_get_batch             NumPy memmap fancy indexing (one thread) / get_batch (one)
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

import mmtensor


def measure(workdir, records, shape, batch_size, workers, repeats):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(records,) + shape, dtype=np.uint8)
    npy = os.path.join(workdir, "data.npy")
    np.save(npy, data)
    path = os.path.join(workdir, "data.mmt")
    with mmtensor.DatasetWriter(path, [mmtensor.Field("x", "uint8", list(shape))], overwrite=True) as w:
        w.append_batch({"x": data})
    del data
    ds = mmtensor.Dataset(path)
    memmap = np.load(npy, mmap_mode="r")
    batches = records // batch_size
    record_bytes = int(np.prod(shape))
    batch_bytes = batch_size * record_bytes

    # The loader's order for one epoch, so every reader gathers the same batches.
    order = np.concatenate([b.indices.numpy().copy() for b in
                            mmtensor.Loader(ds, batch_size=batch_size, sampler="random", seed=1, drop_last=True)])
    index_batches = order.reshape(batches, batch_size)
    out = np.empty((batch_size,) + shape, np.uint8)
    ds.column("x").numpy().sum()  # warm the page cache
    memmap.sum()

    # Enough epochs that a loader's head start (the batches it prefetched before the clock
    # started) is a few percent of what is timed.
    epochs = max(1, -(-400 // batches))
    timed_batches = epochs * batches

    def loader_pass():
        # A fresh loader, its first batch untimed (the ring is allocated and first touched
        # then); destroyed before the other readers run, so its workers take no CPU from them.
        loader = mmtensor.Loader(ds, batch_size=batch_size, sampler="random", seed=1, drop_last=True,
                                 num_workers=workers, prefetch_batches=3)
        loader.next()["x"].numpy()
        start = time.perf_counter()
        taken = 0
        while taken < timed_batches:
            batch = loader.next()
            if batch is None:
                continue  # the end of an epoch; the next one is already being gathered
            batch["x"].numpy()
            taken += 1
        rate = taken / (time.perf_counter() - start)
        del batch, loader
        return rate

    def timed(fn):
        start = time.perf_counter()
        for _ in range(epochs):
            fn()
        return timed_batches / (time.perf_counter() - start)

    def get_batch_epoch():
        for idx in index_batches:
            ds.get_batch(idx, "x", out=out)

    threads = os.cpu_count() or 1

    def get_batch_threads_epoch():
        for idx in index_batches:
            ds.get_batch(idx, "x", out=out, threads=threads)

    def numpy_epoch():
        for idx in index_batches:
            np.take(memmap, idx, axis=0, out=out)

    source = np.empty(batch_bytes, np.uint8)
    source.fill(1)
    flat_out = out.reshape(-1)

    def memcpy_epoch():
        for _ in range(batches):
            np.copyto(flat_out, source)

    result = {"record_bytes": record_bytes, "batch_size": batch_size, "batches_timed": timed_batches,
              "workers": workers}
    rates = {}
    # Interleaved, so drift on a shared machine touches each reader alike; the best pass of each.
    for _ in range(repeats):
        for name, rate in [("loader", loader_pass()), ("get_batch", timed(get_batch_epoch)),
                           ("get_batch_all_cores", timed(get_batch_threads_epoch)),
                           ("numpy_memmap", timed(numpy_epoch)), ("memcpy", timed(memcpy_epoch))]:
            rates[name] = max(rates.get(name, 0.0), rate)
    for name, rate in rates.items():
        result[name + "_batches_per_s"] = round(rate, 1)
        result[name + "_GB_per_s"] = round(rate * batch_bytes / 1e9, 3)
    result["cores"] = threads
    result["loader_vs_get_batch_all_cores"] = round(rates["loader"] / rates["get_batch_all_cores"], 3)
    result["get_batch_vs_memcpy"] = round(rates["get_batch"] / rates["memcpy"], 3)
    result["numpy_vs_get_batch"] = round(rates["numpy_memmap"] / rates["get_batch"], 3)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records-784", type=int, default=200_000)
    parser.add_argument("--records-150k", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    args = parser.parse_args()
    workdir = args.dir or tempfile.mkdtemp(prefix="mmtensor-pybench-")
    try:
        for records, shape in [(args.records_784, (28, 28)), (args.records_150k, (3, 224, 224))]:
            print(json.dumps(measure(workdir, records, shape, args.batch_size, args.workers, args.repeats)), flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
