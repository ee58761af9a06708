#!/usr/bin/env python3
"""Merges every contender's figures into bench/RESULTS.md's Peers section and bench/peers.png.

Inputs under DIR/results: prepare.jsonl (peers' packing), mmtensor_pack.json and
mmtensor_read.json (Google Benchmark, medians), pread.jsonl, hdf5.jsonl, python.jsonl,
disk.jsonl and, where a GPU was found, gpu.json. Only the text between
<!-- peers:begin --> and <!-- peers:end --> in RESULTS.md is replaced.
"""
import argparse
import json
import os
import platform
import re
import subprocess

BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"
COMPRESSED = re.compile(r"lz4|zstd|gzip|lzf")
REFERENCES = {"memcpy", "raw lz4", "raw zstd", "disk", "page cache"}
WORKLOADS = {
    "fmnist": "Fashion-MNIST, real data: {fmnist_records:,} records of image uint8 [1, 28, 28] + label int64",
    "imagenet": "ImageNet-shaped, synthetic photo-like bytes: {imagenet_records:,} records of image uint8 [3, 224, 224] + label int64",
    "tokens": "Token sequences: {token_docs:,} documents of int32 tokens, lengths 16..4096 (log-uniform), {total_tokens:,} tokens",
}
LATENCY_OPS = {"open", "single"}  # figures per event, not per byte
OPS = [("open", "open (page cache warm)"), ("single", "single sample"), ("batch64", "random batch 64"), ("batch256", "random batch 256"),
       ("seq_epoch", "sequential epoch"), ("random_epoch", "random epoch"), ("quasi_epoch", "quasi-random epoch"),
       ("cold_seq_epoch", "cold sequential epoch (open untimed)"),
       ("cold_batch256", "cold random batch 256 (open untimed)")]


def load_rows(results):
    rows = []
    for name in ("prepare.jsonl", "pread.jsonl", "hdf5.jsonl", "python.jsonl", "disk.jsonl"):
        path = os.path.join(results, name)
        if os.path.exists(path):
            rows += [json.loads(l) for l in open(path) if l.strip()]
    for name in ("mmtensor_pack.json", "mmtensor_read.json"):
        path = os.path.join(results, name)
        if not os.path.exists(path):
            continue
        data = json.load(open(path))
        for b in data["benchmarks"]:
            if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                continue
            if "error_occurred" in b and b["error_occurred"]:
                continue
            _, workload, contender, op = b["run_name"].split("/")[:4]
            scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
            rows.append(dict(workload=workload, contender=contender, op=op, lang="C++",
                             seconds=b["real_time"] * scale, items=b.get("records", 0),
                             bytes=b.get("bytes", 0), file_bytes=b.get("file_bytes"),
                             vs_memcpy_alternating=b.get("vs_memcpy"),
                             resident_after_evict=b.get("resident_after_evict"),
                             reps=b.get("repetitions", 1), config=mmtensor_config(workload, contender)))
    return rows


def mmtensor_config(workload, contender):
    if contender.startswith("raw"):
        return f"{contender.split()[1]} library called directly on every chunk payload of mmtensor's file"
    if contender == "memcpy":
        return "the same records memcpy'd from anonymous memory into the same buffer"
    codec = contender.split()[-1]
    chunks = "chunks of 1024 records" if workload == "fmnist" else "1 MiB chunks"
    level = {"none": "uncompressed", "none-noverify": "uncompressed, verify_checksums=false",
             "lz4": "lz4 (fast)", "zstd": "zstd level 3"}[codec]
    # What ReaderOptions{} does (include/mmtensor/dataset.h): Normal readahead; compressed
    # chunks hashed before their first decode; uncompressed ones only with verify_uncompressed.
    if codec == "none-noverify":
        verify = ("no checksum verified; reads exactly as 'mmtensor none' does, whose uncompressed "
                  "chunks are not hashed either, so the two rows show the run-to-run spread")
    elif codec == "none":
        verify = "uncompressed chunks not hashed on read (verify_uncompressed=false, the default)"
    else:
        verify = "each chunk's checksum verified before its first decode (the default)"
    return (f"{chunks}, {level}; default ReaderOptions (madvise NORMAL, {verify}); "
            "get() for single samples, get_batch(threads=1) for batches, get() per document for random tokens, "
            "ragged_column() per chunk-sized run for sequential tokens")


def machine():
    def run(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:
            return ""
    cpu = run("lscpu | sed -n 's/^Model name: *//p'") or platform.processor()
    mem = run("free -g | awk '/Mem:/ {print $2}'")
    return f"{cpu}, {os.cpu_count()} cores, {mem} GiB RAM, Linux {platform.release()}"


def versions():
    out = []
    for mod in ("numpy", "h5py", "zarr", "numcodecs", "torch"):
        try:
            m = __import__(mod)
            out.append(f"{mod} {m.__version__}")
        except Exception:
            pass
    try:
        import h5py
        out.append(f"HDF5 {h5py.version.hdf5_version}")
    except Exception:
        pass
    return ", ".join(out)


def fmt_rate(r):
    if r["op"] in LATENCY_OPS:
        s = r["seconds"] / max(r["items"], 1)
        return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"
    rate = r["bytes"] / r["seconds"]
    return f"{rate / 1e9:.2f} GB/s" if rate >= 1e9 else f"{rate / 1e6:.0f} MB/s"


def throughput(r):
    return r["bytes"] / r["seconds"] if r["seconds"] else 0.0


def klass(contender):
    if contender in REFERENCES:
        return "reference"
    return "compressed" if COMPRESSED.search(contender) else "uncompressed"


def section(rows, config, gpu, figure_name):
    by = {(r["workload"], r["contender"], r["op"]): r for r in rows}
    disk_read = by.get(("disk", "disk", "disk_read"))
    disk_write = by.get(("disk", "disk", "disk_write"))
    evict = by.get(("all", "page cache", "evict_check"))
    lines = [BEGIN, "## Peers: mmtensor beside what users would pick instead", ""]
    lines += [f"Machine: {machine()}. {versions()}. Run mode: "
              f"{'QUICK (reduced sizes, fewer repetitions)' if config.get('quick') else 'full'}; "
              f"regenerate with `scripts/bench.sh` (see README).", ""]
    open_evict = [r["resident_after_evict"] for r in rows if r.get("resident_after_evict") is not None]
    lines += ["How to read it. Every contender reads the **same records** (index files made once with "
              f"seed {config['seed']}) into a preallocated contiguous buffer, on one thread, with one "
              "protocol for all (bench/peers/peer_common.h). **Open** is its own column: the dataset, "
              "memmap, `torch.from_file` mapping, h5py File and datasets, zarr arrays, HDF5 C handles "
              "or pread descriptors (plus the token offsets, read whole) opened on a warm page cache, "
              "median of 21 opens after an untimed first one, closes untimed. **Warm** columns are "
              "steady state on an already open dataset: the files read through, opened once outside "
              "the timer, one untimed pass of the same operation (so each contender's own caches, "
              "mmtensor's decoded chunks and HDF5's chunk cache alike, are as a second epoch finds "
              "them), then the timed passes; open is not in them. **Cold** columns: opened outside "
              "the timer, then the files' pages dropped with `posix_fadvise(POSIX_FADV_DONTNEED)`, "
              "then the reads timed; open is not in them either, and what the open keeps in process "
              "memory (chunk table, HDF5 metadata, offsets) stays, as in a training job" +
              (f"; mincore() found at most {evict['resident_after_evict'] * 100:.1f}% of a file still "
               "cached after eviction with nothing open" if evict else "") +
              (f", and at most {max(open_evict) * 100:.1f}% of an mmtensor file with its dataset open "
               "(the pages its open mapped)" if open_evict else "") +
              ". A warm column of a compressed contender whose cache holds every chunk it reads "
              "(mmtensor's 256 MiB decoded-chunk budget, HDF5's chunk cache set to the same size) "
              "decodes nothing in the timed pass, so `×raw` above 1 there means its cache served "
              "the reads; cold columns always decode. Figures are medians of repeated runs. Throughput counts decoded bytes (image + "
              "label, or tokens) per second; open and single samples are latencies. "
              "`×memcpy` = the same records memcpy'd from anonymous memory (physical limit, warmed "
              "up the same way) divided by the contender's time; `×best peer` compares with the "
              "fastest non-mmtensor contender of the same kind (uncompressed with uncompressed, "
              "compressed with compressed) and, for open and single samples, the same language "
              "level (C++ with C/C++, Python with Python). Epochs are full batches of 256 in order: "
              "sequential, a fixed random permutation, or a quasi-random order (chunks of 1024 "
              f"records shuffled, windows of {config['quasi_window_chunks']} chunks, records "
              "shuffled in a window).", ""]
    if disk_read and disk_write:
        lines += [f"Disk (scratch folder, 1 MiB sequential I/O): read {throughput(disk_read) / 1e9:.2f} GB/s "
                  f"(after eviction), write {throughput(disk_write) / 1e9:.2f} GB/s (with fsync). "
                  "Cold figures give `×disk` = their throughput / this read speed.", ""]
    losses = []
    for wl, title in WORKLOADS.items():
        lines += [f"### {title.format(**config)}", ""]
        ops = [(o, n) for o, n in OPS if any(k[0] == wl and k[2] == o for k in by)]
        contenders = []
        for r in rows:
            if r["workload"] == wl and r["contender"] not in contenders and r["op"] in dict(ops):
                contenders.append(r["contender"])
        order = lambda c: (klass(c) == "reference", klass(c) == "compressed", not c.startswith("mmtensor"), c)
        contenders.sort(key=order)
        lines += ["| contender | lang | " + " | ".join(n for _, n in ops) + " |",
                  "|---|---|" + "---|" * len(ops)]
        for c in contenders:
            cells = []
            for op, _ in ops:
                r = by.get((wl, c, op))
                if not r:
                    cells.append("–")
                    continue
                parts = [fmt_rate(r)]
                ref = by.get((wl, "memcpy", op))
                if c != "memcpy" and ref and not op.startswith("cold"):
                    parts.append(f"{ref['seconds'] / r['seconds'] * (r['items'] / max(ref['items'], 1)):.2f}×memcpy")
                if op.startswith("cold") and disk_read:
                    parts.append(f"{throughput(r) / throughput(disk_read):.2f}×disk")
                codec = re.search(r"lz4|zstd", c)
                raw = codec and by.get((wl, "raw " + codec.group(0), "decode_all"))
                if raw and "epoch" in op and klass(c) == "compressed":
                    parts.append(f"{throughput(r) / throughput(raw):.2f}×raw {codec.group(0)}")
                best = best_peer(by, wl, op, c, r["lang"])
                if best and c.startswith("mmtensor"):
                    ratio = throughput_like(r) / throughput_like(best)
                    parts.append(f"**{ratio:.2f}×best peer**" if ratio >= 1 else f"**{ratio:.2f}×best peer (loses to {best['contender']})**")
                    if ratio < 1:
                        losses.append(f"{wl} / {op} / {c}: {ratio:.2f}× {best['contender']}")
                cells.append("<br>".join(parts))
            lang = next((by[(wl, c, o)]["lang"] for o, _ in ops if (wl, c, o) in by), "")
            lines.append(f"| {c} | {lang} | " + " | ".join(cells) + " |")
        raws = [by.get((wl, f"raw {k}", "decode_all")) for k in ("lz4", "zstd")]
        raw_text = "; ".join(f"{r['contender']} decodes the file's chunks at {throughput(r) / 1e9:.2f} GB/s"
                             for r in raws if r)
        if raw_text:
            lines += ["", f"Raw codecs on mmtensor's own chunk payloads (one thread): {raw_text}."]
        lines += [""] + pack_table(rows, wl) + [""] + config_list(rows, wl) + [""]
    lines += ["### Where mmtensor loses", ""]
    lines += [f"- {l}" for l in losses] or ["- nowhere in this run."]
    lines += ["", "### GPU: loader vs DataLoader(pin_memory=True) and pinned cudaMemcpyAsync", ""]
    if gpu:
        lines += [f"Machine: {gpu.get('device', '?')}.", "", "| contender | batches/s | GB/s | note |", "|---|---|---|---|"]
        for row in gpu.get("rows", []):
            lines.append(f"| {row['contender']} | {row.get('batches_per_s', 0):.1f} | {row.get('GB_per_s', 0):.2f} | {row.get('note', '')} |")
    else:
        lines += ["not measured in this run: no GPU on this machine (scripts/bench.sh runs `mmtensor_bench "
                  "--benchmark_filter=BM_LoaderToDevice` and bench/peer_dataloader.py when "
                  "`nvidia-smi` finds one). Measured on a lent NVIDIA H200 with scripts/gpu-check.sh: "
                  "see \"On a GPU\" under \"Loader (issue 5)\" below."]
    lines += ["", f"![peers]({figure_name})", "", END]
    return "\n".join(lines)


def throughput_like(r):
    return r["items"] / r["seconds"] if r["op"] in LATENCY_OPS else throughput(r)


def best_peer(by, wl, op, contender, lang):
    kind = klass(contender)
    peers = [r for (w, c, o), r in by.items() if w == wl and o == op and not c.startswith("mmtensor")
             and klass(c) == kind and (op not in LATENCY_OPS or (r["lang"] == "C++") == (lang == "C++"))]
    return max(peers, key=throughput_like, default=None)


def pack_table(rows, wl):
    packs = [r for r in rows if r["workload"] == wl and r["op"] == "pack"]
    if not packs:
        return []
    best = min(r["seconds"] for r in packs if not r["contender"].startswith("mmtensor"))
    out = ["| packing | time | file size | × source bytes | time × fastest peer |", "|---|---|---|---|---|"]
    for r in sorted(packs, key=lambda r: r["seconds"]):
        out.append(f"| {r['contender']} | {r['seconds']:.2f} s | {r['file_bytes'] / 1e6:.1f} MB | "
                   f"{r['file_bytes'] / r['bytes']:.2f} | {r['seconds'] / best:.2f} |")
    return out


def config_list(rows, wl):
    seen = {}
    for r in rows:
        if r["workload"] == wl and r.get("config") and r["contender"] not in seen:
            seen[r["contender"]] = r["config"]
    return ["Configuration: " + "; ".join(f"**{c}**: {cfg}" for c, cfg in seen.items()) + "."]


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("fmnist", "batch256"), ("fmnist", "random_epoch"), ("fmnist", "quasi_epoch"),
              ("imagenet", "batch256"), ("imagenet", "seq_epoch"), ("imagenet", "cold_seq_epoch"),
              ("tokens", "batch256"), ("tokens", "seq_epoch"), ("fmnist", "cold_batch256")]
    fig, axes = plt.subplots(3, 3, figsize=(16, 13))
    for ax, (wl, op) in zip(axes.flat, panels):
        sel = sorted([r for r in rows if r["workload"] == wl and r["op"] == op and r["seconds"] > 0],
                     key=throughput)
        names = [f"{r['contender']} ({r['lang']})" for r in sel]
        colors = ["tab:red" if r["contender"].startswith("mmtensor") else
                  "tab:gray" if r["contender"] in REFERENCES else "tab:blue" for r in sel]
        ax.barh(names, [throughput(r) / 1e9 for r in sel], color=colors)
        ax.set_xscale("log")
        ax.set_title(f"{wl}: {op}", fontsize=10)
        ax.set_xlabel("GB/s (log)")
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle("mmtensor (red) vs peers (blue) and physical limits (gray); same records, medians", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--results-md", required=True)
    p.add_argument("--png", required=True)
    a = p.parse_args()
    config = json.load(open(os.path.join(a.dir, "config.json")))
    rows = load_rows(os.path.join(a.dir, "results"))
    gpu_path = os.path.join(a.dir, "results", "gpu.json")
    gpu = json.load(open(gpu_path)) if os.path.exists(gpu_path) else None
    text = section(rows, config, gpu, os.path.basename(a.png))
    old = open(a.results_md).read() if os.path.exists(a.results_md) else "# mmtensor benchmark results\n"
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    with open(a.results_md, "w") as f:
        f.write(new)
    plot(rows, a.png)
    print(f"report: wrote {a.results_md} (peers section) and {a.png}")


if __name__ == "__main__":
    main()
