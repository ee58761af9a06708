#!/usr/bin/env python3
"""The Python peers, read the way their documentation recommends, on the files prepare.py made.

Every contender reads the same records (indices/*.npy) into a preallocated contiguous buffer,
one thread (Blosc pinned to 1 thread, as mmtensor's get_batch is run with 1), with the
protocol of peer_common.h: open is its own figure (median of OPEN_REPEATS opens, page cache
warm); a warm op reads the files through, opens once outside the timer, runs one untimed pass,
then times --reps passes on that open handle; a cold_* op opens outside the timer, drops the
files' pages with posix_fadvise(POSIX_FADV_DONTNEED), then times the reads. The figure is the
median. One JSON line per figure.
  python_peers.py --dir DIR --reps 3 --out results/python.jsonl
"""
import argparse
import ctypes
import json
import mmap
import os
import sys
import time

import numpy as np

EPOCH_BATCH = 256
OPEN_REPEATS = 21  # = peer_common.h's kOpenRepeats
H5_CACHE = dict(rdcc_nbytes=256 << 20, rdcc_nslots=100003, rdcc_w0=1.0)  # = mmtensor's budget


def warm(path):
    paths = [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [path]
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass


def evict(path):
    paths = [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [path]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_fraction(path):
    """mincore() over the file: the check that eviction really empties the page cache."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), f"mmap of {path}")
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    rc = _libc.mincore(addr, size, vec)
    _libc.munmap(addr, size)
    if rc != 0:
        raise OSError(ctypes.get_errno(), f"mincore of {path}")
    return sum(v & 1 for v in vec) / pages


def rows_for(root, workload, op, records):
    if op in ("seq_epoch", "cold_seq_epoch"):
        n = records // EPOCH_BATCH * EPOCH_BATCH
        return np.arange(n, dtype=np.int64).reshape(-1, EPOCH_BATCH), True
    name = "batch256" if op == "cold_batch256" else op
    idx = np.load(f"{root}/indices/{workload}_{name}.npy")
    if idx.ndim == 1:
        batch = 1 if op == "single" else EPOCH_BATCH
        idx = idx[: len(idx) // batch * batch].reshape(-1, batch)
    return idx, False


# ---- contenders over fixed records (image + label) -----------------------------------------

class NumpyMemmap:
    """np.load(mmap_mode='r'): numpy's documented way to read part of a large .npy."""
    config = "np.load(mmap_mode='r'); np.take(..., out=) for batches"

    def __init__(self, d):
        self.files = [f"{d}/images.npy", f"{d}/labels.npy"]

    def open(self):
        self.images = np.load(self.files[0], mmap_mode="r")
        self.labels = np.load(self.files[1], mmap_mode="r")

    def close(self):
        self.images = self.labels = None

    def single(self, i, img, lbl):
        img[0] = self.images[i]
        lbl[0] = self.labels[i]

    def batch(self, idx, img, lbl):
        np.take(self.images, idx, axis=0, out=img)
        np.take(self.labels, idx, out=lbl)

    def range(self, s, e, img, lbl):
        img[...] = self.images[s:e]
        lbl[...] = self.labels[s:e]


class TorchFromFile:
    """torch.from_file(shared=False) maps the .npy; the header is sliced off as a view."""
    config = "torch.from_file(shared=False) of the .npy, header sliced off; index_select(out=)"

    def __init__(self, d):
        self.files = [f"{d}/images.npy", f"{d}/labels.npy"]

    @staticmethod
    def _map(path, dtype, np_dtype):
        import torch
        header = np.load(path, mmap_mode="r")
        shape, offset = header.shape, header.offset
        del header
        raw = torch.from_file(path, shared=False, size=os.path.getsize(path), dtype=torch.uint8)
        return raw[offset:].view(dtype).view(shape)

    def open(self):
        import torch
        self.torch = torch
        self.images = self._map(self.files[0], torch.uint8, np.uint8)
        self.labels = self._map(self.files[1], torch.int64, np.int64)

    def close(self):
        self.images = self.labels = None

    def single(self, i, img, lbl):
        img[0].copy_(self.images[i])
        lbl[0] = self.labels[i]

    def batch(self, idx, img, lbl):
        self.torch.index_select(self.images, 0, idx, out=img)
        self.torch.index_select(self.labels, 0, idx, out=lbl)

    def range(self, s, e, img, lbl):
        img.copy_(self.images[s:e])
        lbl.copy_(self.labels[s:e])


class H5py:
    """h5py with the chunk cache raised to mmtensor's decoded budget (h5py.File rdcc_*);
    read_direct into the buffer. Batches: with one record per chunk, read_direct per record;
    with many, sorted unique fancy indexing (h5py needs increasing indices) then np.take into
    request order -- whichever is faster for the layout (measured 10x either way)."""

    def __init__(self, path, config):
        self.files = [path]
        self.config = config + ", rdcc_nbytes=256 MiB, " + (
            "read_direct per record" if "one record per chunk" in config else "sorted fancy indexing")

    def open(self):
        import h5py
        self.f = h5py.File(self.files[0], "r", **H5_CACHE)
        self.images, self.labels = self.f["images"], self.f["labels"]
        self.per_record = self.images.chunks[0] == 1

    def close(self):
        self.f.close()
        self.f = self.images = self.labels = None

    def single(self, i, img, lbl):
        self.images.read_direct(img, np.s_[i:i + 1], np.s_[0:1])
        self.labels.read_direct(lbl, np.s_[i:i + 1], np.s_[0:1])

    def batch(self, idx, img, lbl):
        if self.per_record:
            for k, i in enumerate(idx):
                self.images.read_direct(img, np.s_[i:i + 1], np.s_[k:k + 1])
                self.labels.read_direct(lbl, np.s_[i:i + 1], np.s_[k:k + 1])
            return
        unique, inverse = np.unique(idx, return_inverse=True)
        np.take(self.images[unique], inverse, axis=0, out=img)
        np.take(self.labels[unique], inverse, out=lbl)

    def range(self, s, e, img, lbl):
        self.images.read_direct(img, np.s_[s:e])
        self.labels.read_direct(lbl, np.s_[s:e])


class Zarr:
    """zarr v2 arrays; get_*_selection(out=) into the buffer; orthogonal selection for batches."""

    def __init__(self, path, config):
        self.files = [path]
        self.config = config + ", Blosc 1 thread"

    def open(self):
        import zarr
        g = zarr.open_group(self.files[0], mode="r")
        self.images, self.labels = g["images"], g["labels"]

    def close(self):
        self.images = self.labels = None

    def single(self, i, img, lbl):
        self.images.get_basic_selection(slice(i, i + 1), out=img[0:1])
        self.labels.get_basic_selection(slice(i, i + 1), out=lbl[0:1])

    def batch(self, idx, img, lbl):
        self.images.get_orthogonal_selection(idx, out=img)
        self.labels.get_orthogonal_selection(idx, out=lbl)

    def range(self, s, e, img, lbl):
        self.images.get_basic_selection(slice(s, e), out=img)
        self.labels.get_basic_selection(slice(s, e), out=lbl)


def run_fixed(c, op, rows, sequential, img, lbl):
    """Every row of the op, once, on the already open contender `c`."""
    if op == "single":
        for i in rows[:, 0]:
            c.single(int(i), img, lbl)
    elif sequential:
        for r in rows:
            c.range(int(r[0]), int(r[-1]) + 1, img, lbl)
    else:
        for r in rows:
            c.batch(r, img, lbl)


# ---- token sequences: the flat-array-plus-offsets layout ------------------------------------

class FlatOffsets:
    """tokens.npy (flat int32) memmapped, offsets.npy read whole: the layout LM pretraining
    code (Megatron-style indexed datasets, nanoGPT's .bin) uses."""
    config = "np.load(tokens.npy, mmap_mode='r') + offsets in memory; slices copied per document"

    def __init__(self, d):
        self.files = [f"{d}/tokens.npy", f"{d}/offsets.npy"]

    def open(self):
        self.tokens = np.load(self.files[0], mmap_mode="r")
        self.offsets = np.load(self.files[1])

    def close(self):
        self.tokens = self.offsets = None

    def gather(self, idx, values):
        off, filled = self.offsets, 0
        for i in idx:
            a, b = off[i], off[i + 1]
            values[filled:filled + b - a] = self.tokens[a:b]
            filled += b - a
        return filled

    def range(self, s, e, values):
        a, b = self.offsets[s], self.offsets[e]
        values[:b - a] = self.tokens[a:b]


def run_tokens(c, rows, sequential, values):
    for r in rows:
        if sequential:
            c.range(int(r[0]), int(r[-1]) + 1, values)
        else:
            c.gather(r, values)


# ---- protocol --------------------------------------------------------------------------------

def emit(out, workload, name, lang, config, op, seconds, items, nbytes):
    row = dict(workload=workload, contender=name, op=op, lang=lang, seconds=float(np.median(seconds)),
               items=int(items), bytes=float(nbytes), reps=len(seconds), config=config)
    out.write(json.dumps(row) + "\n")
    out.flush()
    print(f"  {workload}/{name}/{op}: {row['seconds']:.6f} s", file=sys.stderr)


def measure_open(out, workload, name, lang, config, c):
    """c.open() alone, page cache warm; the first open (imports, library start-up) is untimed
    and every close is outside the timer."""
    for f in c.files:
        warm(f)
    c.open()
    c.close()
    seconds = []
    for _ in range(OPEN_REPEATS):
        t0 = time.perf_counter()
        c.open()
        seconds.append(time.perf_counter() - t0)
        c.close()
    emit(out, workload, name, lang, config, "open", seconds, 1, 0)


def measure(out, workload, name, lang, config, op, c, reps, read, items, nbytes):
    """read() reads every row of the op once from the open contender `c`."""
    seconds = []
    if op.startswith("cold_"):
        for _ in range(reps):
            c.open()
            try:
                for f in c.files:
                    evict(f)
                t0 = time.perf_counter()
                read()
                seconds.append(time.perf_counter() - t0)
            finally:
                c.close()
    else:
        for f in c.files:
            warm(f)
        c.open()
        try:
            read()  # the untimed warm-up pass: the timed ones are steady state
            for _ in range(reps):
                t0 = time.perf_counter()
                read()
                seconds.append(time.perf_counter() - t0)
        finally:
            c.close()
    emit(out, workload, name, lang, config, op, seconds, items, nbytes)


FIXED_OPS = ["single", "batch64", "batch256", "seq_epoch", "random_epoch", "quasi_epoch",
             "cold_seq_epoch", "cold_batch256"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--only", default="", help="comma-separated contender names (default: all)")
    a = p.parse_args()
    import numcodecs
    import torch
    numcodecs.blosc.set_nthreads(1)
    torch.set_num_threads(1)
    root = a.dir
    config = json.load(open(f"{root}/config.json"))
    cr = config["fmnist_chunk_records"]
    fm, im = f"{root}/fmnist", f"{root}/imagenet"
    fixed = {
        "fmnist": [("numpy memmap", NumpyMemmap(fm)), ("torch.from_file", TorchFromFile(fm)),
                   ("h5py", H5py(f"{fm}/data.h5", f"chunks of {cr} records, uncompressed")),
                   ("h5py gzip", H5py(f"{fm}/data_gzip.h5", f"chunks of {cr} records, gzip {config['h5_gzip_level']}")),
                   ("h5py lzf", H5py(f"{fm}/data_lzf.h5", f"chunks of {cr} records, lzf")),
                   ("zarr lz4", Zarr(f"{fm}/zarr_lz4.zarr", f"chunks of {cr} records, Blosc lz4 clevel {config['zarr_lz4_clevel']}")),
                   ("zarr zstd", Zarr(f"{fm}/zarr_zstd.zarr", f"chunks of {cr} records, Blosc zstd clevel {config['zarr_zstd_clevel']}"))],
        "imagenet": [("numpy memmap", NumpyMemmap(im)), ("torch.from_file", TorchFromFile(im)),
                     ("h5py", H5py(f"{im}/data.h5", "one record per chunk, uncompressed"))],
    }
    only = set(filter(None, a.only.split(",")))
    with open(a.out, "w") as out:
        # Evidence that a cold run starts cold: pages left after eviction, per file.
        checked = [f for c in (NumpyMemmap(fm), NumpyMemmap(im), FlatOffsets(f"{root}/tokens")) for f in c.files]
        for f in checked:
            evict(f)
        worst = max(resident_fraction(f) for f in checked)
        out.write(json.dumps(dict(workload="all", contender="page cache", op="evict_check", lang="-",
                                  seconds=0, items=0, bytes=0, reps=1, resident_after_evict=worst,
                                  config="largest resident fraction after posix_fadvise(DONTNEED)")) + "\n")
        for workload, contenders in fixed.items():
            records = np.load(f"{root}/{workload}/labels.npy", mmap_mode="r").shape[0]
            shape = np.load(f"{root}/{workload}/images.npy", mmap_mode="r").shape[1:]
            record_bytes = int(np.prod(shape)) + 8
            for name, c in contenders:
                if only and name not in only:
                    continue
                measure_open(out, workload, name, "Python", c.config, c)
                for op in FIXED_OPS:
                    if op == "quasi_epoch" and workload != "fmnist":
                        continue
                    rows, sequential = rows_for(root, workload, op, records)
                    is_torch = isinstance(c, TorchFromFile)
                    if is_torch:
                        img = torch.empty((rows.shape[1],) + shape, dtype=torch.uint8)
                        lbl = torch.empty(rows.shape[1], dtype=torch.int64)
                        rows_used = torch.from_numpy(rows)
                    else:
                        img = np.empty((rows.shape[1],) + shape, np.uint8)
                        lbl = np.empty(rows.shape[1], np.int64)
                        rows_used = rows
                    measure(out, workload, name, "Python", c.config, op, c, a.reps,
                            lambda: run_fixed(c, op, rows_used, sequential, img, lbl),
                            rows.size, rows.size * record_bytes)
        tok = FlatOffsets(f"{root}/tokens")
        offsets = np.load(f"{root}/tokens/offsets.npy")
        if not only or "flat+offsets memmap" in only:
            measure_open(out, "tokens", "flat+offsets memmap", "Python", tok.config, tok)
            for op in ["single", "batch64", "batch256", "seq_epoch", "cold_seq_epoch"]:
                rows, sequential = rows_for(root, "tokens", op, len(offsets) - 1)
                values = np.empty(rows.shape[1] * 4096, np.int32)
                nbytes = int((offsets[rows + 1] - offsets[rows]).sum()) * 4
                measure(out, "tokens", "flat+offsets memmap", "Python", tok.config, op, tok, a.reps,
                        lambda: run_tokens(tok, rows, sequential, values), rows.size, nbytes)


if __name__ == "__main__":
    main()
