#!/usr/bin/env python3
"""Fashion-MNIST from Python, end to end: read the IDX files Debian's dataset-fashion-mnist
package ships, pack them with mmtensor.DatasetWriter, read samples back and check them
against the source, and run loader epochs, checking every batch.

    PYTHONPATH=build/python python3 python/examples/fashion_mnist.py [--out DIR] [--codec lz4]

Exits 0 when every check passes, 1 when one fails, 77 (skipped) without the dataset files.
"""
import argparse
import gzip
import os
import sys
import tempfile
import time

import numpy as np

import mmtensor

SOURCE = "/usr/share/datasets/fashion-mnist"


def read_idx(path, header_bytes, shape):
    """An IDX file's values (after its header) as a uint8 array of `shape`."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    return np.frombuffer(data, np.uint8, offset=header_bytes).reshape(shape)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the .mmt file (default: a temporary one)")
    parser.add_argument("--codec", default="lz4", help="none, lz4 or zstd[:LEVEL]")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    images_path = os.path.join(SOURCE, "train-images-idx3-ubyte.gz")
    labels_path = os.path.join(SOURCE, "train-labels-idx1-ubyte.gz")
    if not (os.path.exists(images_path) and os.path.exists(labels_path)):
        print(f"skipped: {SOURCE} has no Fashion-MNIST (apt-get install dataset-fashion-mnist)")
        return 77
    images = read_idx(images_path, 16, (-1, 28, 28))
    labels = read_idx(labels_path, 8, (-1,))
    print(f"source: {len(images)} images {images.shape[1:]} uint8, labels {labels.min()}..{labels.max()}")

    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(args.out or scratch, f"fashion-mnist-train-{args.codec.split(':')[0]}-py.mmt")
        fields = [mmtensor.Field("images", "uint8", [28, 28]), mmtensor.Field("labels", "uint8")]
        start = time.perf_counter()
        with mmtensor.DatasetWriter(path, fields, codec=args.codec, overwrite=True,
                                    metadata={"source": "Fashion-MNIST train (dataset-fashion-mnist)"}) as writer:
            writer.append_batch({"images": images, "labels": labels})
        packed = time.perf_counter() - start
        ds = mmtensor.Dataset(path)
        info = ds.info()
        print(f"packed {len(ds)} records with {info['codec']} in {packed:.2f} s: {info['file_bytes']} bytes, "
              f"{info['chunks']} chunks, {info['decoded_bytes'] / max(info['stored_bytes'], 1):.2f}x")

        rng = np.random.default_rng()
        picks = rng.integers(0, len(ds), size=1000)
        bad = [int(i) for i in picks
               if not (np.array_equal(ds[int(i)]["images"].numpy(), images[i]) and ds[int(i)]["labels"].item() == labels[i])]
        batch = ds.get_batch(picks, ["images", "labels"], threads=2)
        if not (np.array_equal(batch["images"].numpy(), images[picks]) and np.array_equal(batch["labels"].numpy(), labels[picks])):
            bad.append("get_batch")
        print(f"checked 1000 random records against the source (ds[i] and get_batch): "
              f"{'all equal' if not bad else f'{len(bad)} differ, e.g. {bad[:5]}'}")

        loader = mmtensor.Loader(ds, batch_size=256, sampler="random", seed=int(rng.integers(1 << 31)), num_workers=2)
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            seen = np.zeros(len(ds), np.int64)
            start = time.perf_counter()
            batches = 0
            for b in loader:
                indices = b.indices.numpy()
                seen[indices] += 1
                if not (np.array_equal(b["images"].numpy(), images[indices]) and
                        np.array_equal(b["labels"].numpy(), labels[indices])):
                    bad.append(f"epoch {epoch} batch {b.number}")
                batches += 1
            seconds = time.perf_counter() - start
            once = bool((seen == 1).all())
            if not once:
                bad.append(f"epoch {epoch}: records not seen exactly once")
            print(f"loader epoch {epoch}: {batches} batches in {seconds * 1000:.0f} ms "
                  f"({len(ds) / seconds / 1e6:.2f} M samples/s, checks included), every record once: {once}")
        loader.close()
    if bad:
        print(f"FAILED: {bad[:10]}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
