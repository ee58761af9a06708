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
import concurrent.futures
import errno
import multiprocessing
import multiprocessing.connection
import operator
import os
import pickle
import secrets
import signal
import stat
import threading
import time
import traceback

from ._mmtensor import DatasetWriter

# What each worker process holds, set once by _start_worker: under "fork" the inputs and the
# function are inherited rather than pickled per task.
_job = None
_writing = False     # whether this worker is inside a shard's writer
_terminated = False  # whether SIGTERM (the parent stopping the workers) ended the shard
_parent = None       # this worker's parent process when it started: write_shards' caller, or
                     # under "forkserver" the server (which ends with the caller)


def _start_worker(job):
    global _job, _parent
    _job = job
    _parent = os.getppid()
    # The parent answers Ctrl-C (the whole process group gets it) by stopping the workers with
    # SIGTERM; a worker then leaves through its writer's abort(), which removes its temporary
    # file, rather than die with it there.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum, frame):
    global _terminated
    if _terminated:
        # Again (the parent stops the workers, then the executor does): the first one's
        # cleanup is running and ends in os._exit (_run_shard). Raising here could end that
        # cleanup in an exception the executor's worker loop catches, leaving the worker alive.
        return
    if _writing:
        _terminated = True
        raise SystemExit(128 + signum)
    os._exit(128 + signum)  # idle: nothing to clean up


def _exit_on_sigterm_in_parent(signum, frame):
    raise SystemExit(128 + signum)


# The largest error (pickled, with its formatted traceback) sent back as it is. The executor
# writes a message of up to 16 KiB to its pipe at once; a larger one goes in parts, and a
# worker stopped between them leaves the parent waiting for the rest for ever. A
# UnicodeDecodeError or JSONDecodeError holds the whole input it was decoding.
_MAX_ERROR_BYTES = 8192


def _cut(text, limit):
    return text if len(text) <= limit else "%s... (%d characters more)" % (text[:limit], len(text) - limit)


def _portable(error):
    """`error`, or a RuntimeError with its text (cut to 2,000 characters) and notes when the
    parent could not rebuild it (an exception of the user's whose constructor takes other
    arguments, or that holds a lock), when it is larger than _MAX_ERROR_BYTES, or when it is
    no error of the shard's (SystemExit from fn: not the worker's end)."""
    if isinstance(error, Exception):
        try:
            sent = len(pickle.dumps(error)) + len("".join(
                traceback.format_exception(type(error), error, error.__traceback__)))
            pickle.loads(pickle.dumps(error))
            if sent <= _MAX_ERROR_BYTES:
                return error
        except Exception:
            pass
    text = str(error)
    portable = RuntimeError(_cut("%s%s" % (type(error).__qualname__, ": %s" % text if text else ""), 2000))
    portable.__notes__ = [_cut(str(note), 500) for note in getattr(error, "__notes__", [])[:8]]
    return portable


def _run_shard(shard):
    """The task each worker runs: _write_shard, after which a worker that SIGTERM stopped
    exits, whatever path the SystemExit took. concurrent.futures' worker loop catches every
    exception of a task and takes the next one; a stopped worker kept alive that way would
    wait on queue locks that the workers killed with it may have held, and the parent's
    shutdown would wait for it forever."""
    try:
        return _write_shard(shard)
    finally:
        if _terminated:
            os._exit(128 + signal.SIGTERM)


def _write_shard(shard):
    """Writes shard `shard` to its partial path; returns (shard, records)."""
    global _writing
    job = _job
    inputs, fn = job["inputs"], job["fn"]
    records, shards = len(inputs), job["shards"]
    begin, end = shard * records // shards, (shard + 1) * records // shards
    metadata = dict(job["metadata"])
    if shards > 1:  # as `mmt pack --shard`: one shard of one is no shard
        metadata["pack_shard"] = "%d/%d of %d" % (shard, shards, records)
        metadata["pack_source"] = job["source"]
    writer = None
    try:
        _writing = True  # inside: a SIGTERM right after it is met by the cleanup below
        # SIGTERM held back until `writer` is set, so that the abort below always finds it.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            writer = DatasetWriter(job["partials"][shard], job["fields"], metadata=metadata, **job["writer"])
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        for i in range(begin, end):
            if os.getppid() != _parent:  # the parent died (SIGKILL): stop, leave nothing
                raise SystemExit(1)
            try:
                record = inputs[i] if fn is None else fn(inputs[i])
                if record is None:
                    raise ValueError("returned None; every input must give a record (filter the inputs beforehand)")
                writer.append(record)
            except BaseException as e:
                if not _terminated:
                    e.add_note("mmtensor.write_shards: while writing inputs[%d] (shard %d of %d)" % (i, shard, shards))
                raise
        writer.finish()
    except BaseException as e:
        if writer is not None:
            writer.abort()  # removes its temporary file
        if _terminated or os.getppid() != _parent:
            os._exit(128 + signal.SIGTERM)  # stopped: an executor's worker would take the next shard
        portable = _portable(e)
        if portable is e:
            raise
        raise portable from None
    finally:
        _writing = False
    return shard, end - begin


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# How long stopped workers have to abort their writers before they are killed.
_STOP_GRACE_SECONDS = 5.0


def _stop_workers(pool):
    """Stops the pool's worker processes: SIGTERM (each aborts its writer), then SIGKILL for
    any still running after _STOP_GRACE_SECONDS (a conversion inside a long native call
    runs no signal handler). Every worker must end: one killed while it held a queue's lock
    leaves any other blocked on that lock for good, and the pool's shutdown joins them all."""
    processes = [p for p in list(pool._processes.values()) if p.exitcode is None]  # 3.8 to 3.14 have it
    running = {process.sentinel: process for process in processes}
    try:
        for process in processes:
            process.terminate()
        # Waiting on the sentinels reaps nothing: the executor's own thread still joins them.
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        while running and time.monotonic() < deadline:
            for sentinel in multiprocessing.connection.wait(list(running), max(0.0, deadline - time.monotonic())):
                del running[sentinel]
    finally:
        # Also when a second Ctrl-C (or SIGTERM) cuts the wait short: the shutdown that
        # follows joins every worker.
        for process in running.values():
            process.kill()


def _refuse_other_than_a_file(path):
    """As DatasetWriter does: a symbolic link (or a FIFO, a socket...) at a shard's path is not
    replaced, even with overwrite=True; the file it points to would silently stop being the
    one at that path."""
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        kind = "a symbolic link" if os.path.islink(path) else "not a regular file"
        raise OSError(errno.EEXIST, "%s is %s; only a regular file is replaced, even when asked to overwrite" % (path, kind))


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
    record (so a row of a 2-D array is a sequence of field values). shards: how many files
    (default: num_workers); num_workers: processes (default: the CPUs this process may use).
    threads: each writer's compression threads (default: CPUs / workers). Other options are
    DatasetWriter's. mp_context: a multiprocessing start method ("fork", "spawn",
    "forkserver"; default, the platform's): under "spawn" and "forkserver", fn and inputs
    must be picklable.

    The fields and the writer's options are checked before any worker starts (a bad codec
    is this call's ValueError). The shards are written under temporary names and renamed
    into place only once every shard is written. An exception in fn (or a record the writer refuses) stops every worker
    (SIGTERM; SIGKILL for one still running 5 s later, inside a long native call), removes
    what was written, and is raised here with a note naming the input (as a RuntimeError
    with its text when it cannot be sent between processes, or is over 8 KiB with its
    traceback: an error holding a whole input); a worker that dies
    (SIGKILL, out of memory) raises BrokenProcessPool the same way; Ctrl-C stops the workers
    and leaves nothing, as does SIGTERM (while the shards are written, SIGTERM raises
    SystemExit where the program set no handler of its own). Workers whose parent dies (SIGKILL)
    stop at their next record. An existing file
    at a shard's path: FileExistsError, unless overwrite=True (the old files of a set of more
    shards are not removed); a symbolic link there: OSError, as DatasetWriter refuses it.
    """
    fields = list(fields)
    if not hasattr(inputs, "__len__") or not hasattr(inputs, "__getitem__"):
        raise TypeError("inputs must be a sequence (len and indexing: a list, a range, an array), not "
                        + type(inputs).__name__)

    def count(name, value):
        try:
            number = operator.index(value)
        except TypeError:
            number = 0
        if isinstance(value, bool) or number < 1:
            raise ValueError("%s must be an int >= 1, got %r" % (name, value))
        return number

    num_workers = count("num_workers", len(os.sched_getaffinity(0)) if num_workers is None else num_workers)
    shards = count("shards", num_workers if shards is None else shards)
    output = os.fsdecode(os.fspath(output))  # bytes too, as every path argument takes
    if "{shard" not in output:
        raise ValueError("output must hold {shard} (as train-{shard:03d}.mmt), where each shard's number goes; got "
                         + repr(output))
    try:
        paths = [output.format(shard=k, shards=shards) for k in range(shards)]
    except (IndexError, KeyError, ValueError) as e:  # another {} or {name}, a bad format spec
        raise ValueError("output %r: only {shard} and {shards} are filled in (write other braces as {{ and }}): %s"
                         % (output, e)) from None
    if len(set(paths)) != shards:
        raise ValueError("output %r gives the same name to several shards" % output)
    for path in paths:
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise FileNotFoundError("cannot write %s: its folder %s does not exist" % (path, folder))
        if os.path.isdir(path):
            raise IsADirectoryError("cannot write %s: it is a folder" % path)
        _refuse_other_than_a_file(path)
        if not overwrite and os.path.lexists(path):
            raise FileExistsError("%s already exists; pass overwrite=True to replace it" % path)
    workers = min(num_workers, shards)
    if threads is None:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
    # One value for every shard of this call: Dataset(paths) takes shards with equal N, R and
    # pack_source as one pack's (written as the packer writes it: 0x and 16 hex digits).
    token = secrets.randbits(64)
    source = "0x%016x" % token
    # Short names beside each shard: a writer shortens a long name for its own temporary file
    # (engine/temp_files.cc), which the sweep below could not then find.
    partials = [os.path.join(os.path.dirname(path), ".shard-%d-%08x.part" % (k, token & 0xFFFFFFFF))
                for k, path in enumerate(paths)]
    writer_options = {"codec": codec, "chunk_bytes": chunk_bytes, "chunk_records": chunk_records,
                      "alignment": alignment, "threads": threads}
    # The fields and options checked here, as a writer takes them, before any worker starts:
    # a bad codec is then this call's ValueError, not one from each worker.
    metadata = dict(metadata or {})
    DatasetWriter(partials[0], fields, metadata=metadata, **writer_options).abort()
    job = {
        "inputs": inputs, "fn": fn, "fields": fields, "shards": shards, "source": source, "partials": partials,
        "metadata": metadata,
        "writer": writer_options,
    }
    context = multiprocessing.get_context(mp_context)
    published = False
    # SIGTERM to this process alone (docker stop, a scheduler's kill) would end it with no
    # cleanup, leaving the shards written so far under their temporary names: while the
    # shards are written it raises SystemExit instead, where no handler of the program's is set.
    sigterm_default = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if sigterm_default:
        signal.signal(signal.SIGTERM, _exit_on_sigterm_in_parent)
    try:
        # concurrent.futures rather than multiprocessing.Pool: a worker that dies raises
        # BrokenProcessPool here, where a Pool waits forever for the shard it held.
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                                      initargs=(job,))
        try:
            for done in concurrent.futures.as_completed([pool.submit(_run_shard, k) for k in range(shards)]):
                done.result()
        except BaseException:
            _stop_workers(pool)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        # Checked again just before: a file made meanwhile is not replaced unasked.
        for path in paths:
            if os.path.isdir(path) or (not overwrite and os.path.lexists(path)):
                raise FileExistsError("%s appeared while the shards were written; nothing was replaced" % path)
            _refuse_other_than_a_file(path)
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
        if sigterm_default:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if not published:
            for partial in partials:
                _remove(partial)
                # A killed worker's writer leaves its temporary (PARTIAL.tmp-...); no later
                # writer targets this name to sweep it.
                folder, name = os.path.split(partial)
                for entry in os.listdir(folder or "."):
                    if entry.startswith(name + ".tmp-"):
                        _remove(os.path.join(folder, entry))
    return paths
