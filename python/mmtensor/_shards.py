"""mmtensor.write_shards(): a conversion of the user's own, run by several processes at once,
each writing one shard; the shards then read as one dataset, in order (Dataset(paths)).

mmtensor.pack() takes the files mmtensor knows (.npy, .npz, IDX, folders). Data in any other
form (images to decode and resize, text to tokenize, rows of a database) goes through a
function of the user's, record by record; on one process that is as slow as the function.
Here inputs are cut into shards as `mmt pack --shard` cuts records (shard k holds inputs
k*R/N up to (k+1)*R/N), each shard is written by a worker process, and each file says which
shard it is (metadata "pack_shard", "pack_source"), so that Dataset(paths) and `mmt verify`
refuse the shards out of order, given twice, or, for verify, a set that is incomplete.
"""
import multiprocessing
import os
import secrets
import signal

from ._mmtensor import DatasetWriter

# What each worker process holds, set once by _start_worker: under "fork" the inputs and the
# function are inherited rather than pickled per task.
_job = None
_writing = False  # whether this worker is inside a shard's writer


def _start_worker(job):
    global _job
    _job = job
    # Pool.terminate() (another worker's error, or Ctrl-C) sends SIGTERM: leave through the
    # writer's with-block, which removes its temporary file, rather than die with it there.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum, frame):
    if _writing:
        raise SystemExit(128 + signum)
    os._exit(128 + signum)  # idle: nothing to clean up


def _write_shard(shard):
    """Writes shard `shard` to its partial path; returns (shard, records)."""
    global _writing
    job = _job
    inputs, fn = job["inputs"], job["fn"]
    records, shards = len(inputs), job["shards"]
    begin, end = shard * records // shards, (shard + 1) * records // shards
    metadata = dict(job["metadata"])
    metadata["pack_shard"] = "%d/%d of %d" % (shard, shards, records)
    metadata["pack_source"] = job["source"]
    writer = None
    _writing = True
    try:
        writer = DatasetWriter(job["partials"][shard], job["fields"], metadata=metadata, **job["writer"])
        for i in range(begin, end):
            try:
                record = inputs[i] if fn is None else fn(inputs[i])
                if record is None:
                    raise ValueError("returned None; every input must give a record (filter the inputs beforehand)")
                writer.append(record)
            except Exception as e:
                e.add_note("mmtensor.write_shards: while writing inputs[%d] (shard %d of %d)" % (i, shard, shards))
                raise
        writer.finish()
    except BaseException:
        if writer is not None:
            writer.abort()  # removes its temporary file
        raise
    finally:
        _writing = False
    return shard, end - begin


def _remove(paths):
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def write_shards(output, fields, inputs, fn=None, *, shards=None, num_workers=None, codec="none",
                 chunk_bytes=1 << 20, chunk_records=0, alignment=4096, threads=None, overwrite=False,
                 metadata=None, mp_context=None):
    """Writes `inputs` (converted by `fn`) as `shards` dataset files, one worker process per
    shard at a time; returns their paths, in order: Dataset(paths) reads them as one.

        def load(path):                               # a module-level function (picklable)
            image = decode_and_resize(path)           # your own conversion
            return {"image": image, "label": label_of(path)}
        paths = mmtensor.write_shards("train-{shard:03d}.mmt",
                                      [mmtensor.Field("image", "uint8", [3, 224, 224]),
                                       mmtensor.Field("label", "int64")],
                                      files, load, num_workers=8, codec="zstd")
        ds = mmtensor.Dataset(paths)

    output: a file name with "{shard}" in it (str.format, which also knows {shards});
    zero-padded numbers ({shard:03d}) keep `ls` in shard order. inputs: a sequence (len and
    indexing: a list, a range, an array); fn(item) gives one record (a dict by field name, or
    a sequence in field order, as DatasetWriter.append takes); without fn, each item is a
    record. shards: how many files (default: num_workers); num_workers: processes (default:
    the CPUs this process may use). threads: each writer's compression threads (default:
    CPUs / workers). Other options are DatasetWriter's. mp_context: a multiprocessing start
    method ("fork", "spawn", "forkserver"; default, the platform's): under "spawn" and
    "forkserver", fn and inputs must be picklable.

    The shards appear together or not at all: each is written under a temporary name and the
    set is renamed into place only once every shard is written. An exception in fn (or a
    record the writer refuses) stops every worker, removes what was written, and is raised
    here with a note naming the input. An existing file at a shard's path: FileExistsError,
    unless overwrite=True.
    """
    fields = list(fields)
    if not hasattr(inputs, "__len__") or not hasattr(inputs, "__getitem__"):
        raise TypeError("inputs must be a sequence (len and indexing: a list, a range, an array), not "
                        + type(inputs).__name__)
    if num_workers is None:
        num_workers = len(os.sched_getaffinity(0))
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError("num_workers must be an int >= 1, got %r" % (num_workers,))
    if shards is None:
        shards = num_workers
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError("shards must be an int >= 1, got %r" % (shards,))
    output = os.fspath(output)
    if "{shard" not in output:
        raise ValueError("output must hold {shard} (as train-{shard:03d}.mmt), where each shard's number goes; got "
                         + repr(output))
    paths = [output.format(shard=k, shards=shards) for k in range(shards)]
    if len(set(paths)) != shards:
        raise ValueError("output %r gives the same name to several shards" % output)
    if not overwrite:
        for path in paths:
            if os.path.lexists(path):
                raise FileExistsError("%s already exists; pass overwrite=True to replace it" % path)
    workers = min(num_workers, shards)
    if threads is None:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
    # One value for every shard of this call: Dataset(paths) takes shards with equal N, R and
    # pack_source as one pack's (16 hex digits, as the packer writes).
    source = "%016x" % secrets.randbits(64)
    partials = ["%s.partial-%s" % (path, source) for path in paths]
    job = {
        "inputs": inputs, "fn": fn, "fields": fields, "shards": shards, "source": source, "partials": partials,
        "metadata": dict(metadata or {}),
        "writer": {"codec": codec, "chunk_bytes": chunk_bytes, "chunk_records": chunk_records, "alignment": alignment,
                   "threads": threads},
    }
    context = multiprocessing.get_context(mp_context)
    published = False
    try:
        with context.Pool(workers, initializer=_start_worker, initargs=(job,)) as pool:
            for _ in pool.imap_unordered(_write_shard, range(shards)):
                pass
            pool.close()  # every shard written: the workers leave on their own (an error
            pool.join()   # leaves the with-block, whose terminate() stops them)
        for partial, path in zip(partials, paths):
            os.replace(partial, path)
        published = True
        # The renames are durable once the folders that hold them are synced.
        for folder in sorted({os.path.dirname(os.path.abspath(p)) for p in paths}):
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        if not published:
            _remove(partials)
    return paths
