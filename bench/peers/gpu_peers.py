#!/usr/bin/env python3
"""The GPU part of the peer benchmarks: mmtensor's Loader to cuda:0 (mmtensor_bench's
BM_LoaderToDevice, which also times pinned cudaMemcpyAsync of the same batch bytes) against
PyTorch's DataLoader(pin_memory=True) over a numpy memmap (bench/peer_dataloader.py, same
record shape [3, 224, 224] uint8, count 8192 and batch 256). Writes gpu.json for report.py.
  gpu_peers.py BUILD_DIR SCRATCH_DIR OUT.json
"""
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
build, scratch, out_path = sys.argv[1:4]
device = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                        capture_output=True, text=True).stdout.strip().splitlines()[0]
bench_json = os.path.join(scratch, "results", "loader_to_device.json")
subprocess.run([os.path.join(build, "mmtensor_bench"), "--benchmark_filter=BM_LoaderToDevice",
                f"--benchmark_out={bench_json}", "--benchmark_out_format=json"], check=True)
rows = []
for b in json.load(open(bench_json))["benchmarks"]:
    if b.get("error_occurred"):
        raise SystemExit(f"gpu_peers: {b['name']}: {b.get('error_message')}")
    workers = b["name"].split("workers:")[1].split("/")[0]
    rows.append(dict(contender=f"mmtensor Loader -> cuda:0, {workers} workers",
                     batches_per_s=b["batches_per_s"], GB_per_s=b["loader_GB_per_s"],
                     note=f"{b['vs_pinned_memcpy']:.2f}× pinned cudaMemcpyAsync"))
    rows.append(dict(contender=f"pinned cudaMemcpyAsync (same run as {workers} workers)",
                     batches_per_s=b["memcpy_GB_per_s"] * 1e9 / (256 * (3 * 224 * 224 + 8)),
                     GB_per_s=b["memcpy_GB_per_s"], note="physical limit: host-to-device copy"))
for workers in (4, 8, 14):  # the worker counts BM_LoaderToDevice runs
    line = subprocess.run([sys.executable, os.path.join(here, "..", "peer_dataloader.py"), "--workers",
                           str(workers), "--dir", scratch], capture_output=True, text=True, check=True)
    d = json.loads(line.stdout.strip().splitlines()[-1])
    rows.append(dict(contender=f"torch DataLoader(pin_memory=True) over np.memmap, {workers} workers",
                     batches_per_s=d["batches_per_s"], GB_per_s=d["GB_per_s"],
                     note=f"torch {d['torch']}, {d['device']}"))
json.dump(dict(device=f"{device}, {os.cpu_count()} CPU cores", rows=rows), open(out_path, "w"), indent=1)
print(f"gpu_peers: wrote {out_path}")
