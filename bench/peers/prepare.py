#!/usr/bin/env python3
"""Prepares the data every contender of the peer benchmarks reads, and times the peers' packing.

Writes, under DIR:
  fmnist/   images.npy [60000,1,28,28] uint8 and labels.npy [60000] int64 (from Debian's
            dataset-fashion-mnist IDX files); h5py files (chunked: uncompressed, gzip, lzf)
            and zarr stores (blosc lz4, blosc zstd), all chunked by CHUNK_RECORDS records
  imagenet/ images.npy [N,3,224,224] uint8 (synthetic, photo-like compressibility),
            labels.npy, data.h5 (one record per chunk, uncompressed)
  tokens/   tokens.npy (flat int32) + offsets.npy (int64 [N+1]): the memmapped
            flat-array-plus-offsets layout language-model pretraining code uses
  indices/  the record indices every contender reads (fixed seed), as int64 .npy
  config.json, results/prepare.jsonl (packing time and file size of each peer)
mmtensor's own files are packed by mmtensor_bench (Peer/*/pack) from the same .npy sources.
"""
import argparse
import gzip
import json
import os
import shutil
import time

import numpy as np

SEED = 20240607
FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
FMNIST_CHUNK_RECORDS = 1024   # ~800 KB of images per chunk for every chunked contender
QUASI_WINDOW_CHUNKS = 8       # chunks whose records are shuffled together
H5_GZIP_LEVEL = 4             # h5py's default gzip level
ZARR_CLEVEL = 5               # numcodecs.Blosc's default clevel
ZARR_ZSTD_CLEVEL = 3          # zstd's own default level, the level mmtensor's zstd uses


def fsync_path(path):
    """Packing times include making the bytes durable, as mmtensor's writer does."""
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            for f in files:
                fsync_path(os.path.join(root, f))
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def size_of(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


class Recorder:
    def __init__(self, path):
        self.out = open(path, "w")

    def pack(self, workload, contender, paths, seconds, config, decoded_bytes):
        files = paths if isinstance(paths, list) else [paths]
        row = dict(workload=workload, contender=contender, op="pack", lang="Python",
                   seconds=seconds, items=0, bytes=decoded_bytes, reps=1, config=config,
                   file_bytes=sum(size_of(p) for p in files))
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        print(f"  packed {workload}/{contender}: {seconds:.2f} s, {row['file_bytes'] / 1e6:.1f} MB")


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def save_npy(path, array):
    def write():
        np.save(path, array)
        fsync_path(path)
    return timed(write)


def write_h5(path, arrays, chunk_records, **filters):
    import h5py

    def write():
        with h5py.File(path, "w") as f:
            for name, a in arrays.items():
                chunks = (min(chunk_records, len(a)),) + a.shape[1:]
                d = f.create_dataset(name, shape=a.shape, dtype=a.dtype, chunks=chunks, **filters)
                step = max(chunk_records, 64)  # whole chunks per write
                for s in range(0, len(a), step):
                    d[s:s + step] = a[s:s + step]
        fsync_path(path)
    return timed(write)


def write_zarr(path, arrays, chunk_records, compressor):
    import zarr

    def write():
        shutil.rmtree(path, ignore_errors=True)
        group = zarr.open_group(path, mode="w")
        for name, a in arrays.items():
            z = group.create_dataset(name, shape=a.shape, dtype=a.dtype,
                                     chunks=(chunk_records,) + a.shape[1:], compressor=compressor)
            step = chunk_records * 16
            for s in range(0, len(a), step):
                z[s:s + step] = a[s:s + step]
        fsync_path(path)
    return timed(write)


def quasi_random_order(n, chunk_records, window_chunks, rng):
    """Shuffled chunks grouped in windows, records shuffled within each window: the order
    a chunk-aware loader uses so each compressed chunk is decoded once per epoch."""
    chunks = rng.permutation((n + chunk_records - 1) // chunk_records)
    order = []
    for w in range(0, len(chunks), window_chunks):
        records = np.concatenate([np.arange(c * chunk_records, min(n, (c + 1) * chunk_records))
                                  for c in chunks[w:w + window_chunks]])
        order.append(rng.permutation(records))
    return np.concatenate(order).astype(np.int64)


def write_indices(dirpath, workload, n, singles, batches, chunk_records, rng):
    np.save(f"{dirpath}/{workload}_single.npy", rng.integers(0, n, singles, dtype=np.int64))
    for b in (64, 256):
        np.save(f"{dirpath}/{workload}_batch{b}.npy",
                rng.integers(0, n, (batches, b), dtype=np.int64))
    np.save(f"{dirpath}/{workload}_random_epoch.npy", rng.permutation(n).astype(np.int64))
    if chunk_records:
        np.save(f"{dirpath}/{workload}_quasi_epoch.npy",
                quasi_random_order(n, chunk_records, QUASI_WINDOW_CHUNKS, rng))


def synthetic_images(n, rng, block=256):
    """Photo-like bytes: smooth low-frequency content plus sensor noise, so codecs find about
    the redundancy they find in decoded photos (random bytes would flatter no one)."""
    for s in range(0, n, block):
        m = min(block, n - s)
        coarse = rng.integers(0, 256, (m, 3, 14, 14), dtype=np.int16)
        smooth = coarse.repeat(16, axis=2).repeat(16, axis=3)
        noise = rng.integers(-6, 7, (m, 3, 224, 224), dtype=np.int16)
        yield s, np.clip(smooth + noise, 0, 255).astype(np.uint8)


def prepare_fmnist(root, rec, quick):
    import h5py  # noqa: F401  (fail early when a peer is missing)
    import numcodecs
    d = f"{root}/fmnist"
    os.makedirs(d, exist_ok=True)
    images = read_idx(f"{FMNIST_DIR}/train-images-idx3-ubyte.gz").reshape(-1, 1, 28, 28)
    labels = read_idx(f"{FMNIST_DIR}/train-labels-idx1-ubyte.gz").astype(np.int64)
    arrays = {"images": images, "labels": labels}
    decoded = images.nbytes + labels.nbytes
    t = save_npy(f"{d}/images.npy", images) + save_npy(f"{d}/labels.npy", labels)
    rec.pack("fmnist", "numpy memmap", [f"{d}/images.npy", f"{d}/labels.npy"], t,
             "np.save (.npy v1.0), read with np.load(mmap_mode='r')", decoded)
    c = FMNIST_CHUNK_RECORDS
    rec.pack("fmnist", "h5py", f"{d}/data.h5", write_h5(f"{d}/data.h5", arrays, c),
             f"chunks of {c} records, uncompressed", decoded)
    rec.pack("fmnist", "h5py gzip", f"{d}/data_gzip.h5",
             write_h5(f"{d}/data_gzip.h5", arrays, c, compression="gzip",
                      compression_opts=H5_GZIP_LEVEL),
             f"chunks of {c} records, gzip level {H5_GZIP_LEVEL}", decoded)
    rec.pack("fmnist", "h5py lzf", f"{d}/data_lzf.h5",
             write_h5(f"{d}/data_lzf.h5", arrays, c, compression="lzf"),
             f"chunks of {c} records, lzf", decoded)
    for cname, level in (("lz4", ZARR_CLEVEL), ("zstd", ZARR_ZSTD_CLEVEL)):
        comp = numcodecs.Blosc(cname=cname, clevel=level, shuffle=numcodecs.Blosc.SHUFFLE)
        path = f"{d}/zarr_{cname}.zarr"
        rec.pack("fmnist", f"zarr {cname}", path, write_zarr(path, arrays, c, comp),
                 f"zarr v2, chunks of {c} records, Blosc({cname}, clevel={level}, shuffle)",
                 decoded)
    return len(images)


def prepare_imagenet(root, rec, target_bytes, rng):
    d = f"{root}/imagenet"
    os.makedirs(d, exist_ok=True)
    n = max(512, int(target_bytes // (3 * 224 * 224)))
    path = f"{d}/images.npy"
    images = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(n, 3, 224, 224))
    for s, block in synthetic_images(n, rng):
        images[s:s + len(block)] = block
    images.flush()
    del images
    labels = rng.integers(0, 1000, n, dtype=np.int64)
    np.save(f"{d}/labels.npy", labels)
    fsync_path(path)
    # The source is generated in place, so the .npy peer's packing time is a plain copy of
    # the mapped array through np.save, which is what a user converting to .npy pays.
    images = np.load(path, mmap_mode="r")
    t = save_npy(f"{d}/images_copy.npy", images)
    os.remove(f"{d}/images_copy.npy")
    decoded = images.nbytes + labels.nbytes
    rec.pack("imagenet", "numpy memmap", [path, f"{d}/labels.npy"], t,
             "np.save (.npy v1.0), read with np.load(mmap_mode='r')", decoded)
    rec.pack("imagenet", "h5py", f"{d}/data.h5",
             write_h5(f"{d}/data.h5", {"images": images, "labels": labels}, 1),
             "one record (147 KiB) per chunk, uncompressed", decoded)
    return n


def prepare_tokens(root, rec, docs, rng):
    d = f"{root}/tokens"
    os.makedirs(d, exist_ok=True)
    # Log-uniform lengths in [16, 4096]: many short documents, a long tail of long ones.
    lengths = np.exp(rng.uniform(np.log(16), np.log(4096 + 1), docs)).astype(np.int64)
    lengths = np.clip(lengths, 16, 4096)
    offsets = np.zeros(docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # Zipf-like token ids below GPT-2's vocabulary size: frequent ids dominate, as in text.
    tokens = np.minimum(rng.zipf(1.3, int(offsets[-1])) - 1, 50256).astype(np.int32)
    t = save_npy(f"{d}/tokens.npy", tokens) + save_npy(f"{d}/offsets.npy", offsets)
    rec.pack("tokens", "flat+offsets memmap", [f"{d}/tokens.npy", f"{d}/offsets.npy"], t,
             "flat int32 tokens.npy + int64 offsets.npy (N+1), np.memmap", tokens.nbytes + offsets.nbytes)
    return docs, int(offsets[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--imagenet-bytes", type=float, default=2e9)
    p.add_argument("--token-docs", type=int, default=100_000)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    root = a.dir
    for sub in ("indices", "results"):
        os.makedirs(f"{root}/{sub}", exist_ok=True)
    rng = np.random.default_rng(SEED)
    rec = Recorder(f"{root}/results/prepare.jsonl")
    singles, batches = (1000, 8) if a.quick else (4000, 40)
    print("prepare: fashion-mnist")
    n_fm = prepare_fmnist(root, rec, a.quick)
    write_indices(f"{root}/indices", "fmnist", n_fm, singles, batches, FMNIST_CHUNK_RECORDS, rng)
    print("prepare: imagenet-shaped")
    n_in = prepare_imagenet(root, rec, a.imagenet_bytes, rng)
    write_indices(f"{root}/indices", "imagenet", n_in, singles // 5, batches // 2, 0, rng)
    print("prepare: token sequences")
    n_tok, total_tokens = prepare_tokens(root, rec, a.token_docs, rng)
    write_indices(f"{root}/indices", "tokens", n_tok, singles, batches, 0, rng)
    config = dict(seed=SEED, quick=a.quick, fmnist_records=n_fm, imagenet_records=n_in,
                  token_docs=n_tok, total_tokens=total_tokens,
                  fmnist_chunk_records=FMNIST_CHUNK_RECORDS,
                  quasi_window_chunks=QUASI_WINDOW_CHUNKS, h5_gzip_level=H5_GZIP_LEVEL,
                  zarr_lz4_clevel=ZARR_CLEVEL, zarr_zstd_clevel=ZARR_ZSTD_CLEVEL)
    with open(f"{root}/config.json", "w") as f:
        json.dump(config, f, indent=1)


if __name__ == "__main__":
    main()
