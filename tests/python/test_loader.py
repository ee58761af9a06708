"""The Python API's Loader: every sample once an epoch, batches equal to get_batch, resume,
distributed ranks, subsets, and batches that stay valid while Python views them."""
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

import mmtensor
from run_tests import native_stacks

RECORDS = 1000


def wait_for_child(pid, seconds):
    """The child's exit code, or None when it is still running after `seconds`: it is then
    killed, after its threads' native stacks (gdb, where installed) are printed, so that a
    hang in CI shows where it was."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    try:
        print(f"\nchild {pid} still running after {seconds} s; its threads:\n{native_stacks(pid)}", flush=True)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return None


class LoaderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(3)
        cls.images = rng.integers(0, 256, size=(RECORDS, 4, 4), dtype=np.uint8)
        cls.labels = np.arange(RECORDS, dtype=np.int64)
        cls.tokens = [rng.integers(0, 100, size=int(n)).astype(np.int32) for n in rng.integers(0, 9, size=RECORDS)]
        cls.path = os.path.join(cls.dir.name, "data.mmt")
        fields = [mmtensor.Field("image", "uint8", [4, 4]), mmtensor.Field("label", "int64"),
                  mmtensor.Field("tokens", "int32", [-1])]
        with mmtensor.DatasetWriter(cls.path, fields, codec="lz4", chunk_records=100) as writer:
            for i in range(RECORDS):
                writer.append({"image": cls.images[i], "label": cls.labels[i], "tokens": cls.tokens[i]})
        cls.ds = mmtensor.Dataset(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def epoch_labels(self, loader):
        return np.concatenate([batch["label"].numpy().copy() for batch in loader])

    def test_an_epoch_visits_every_record_once_and_batches_hold_their_records(self):
        for sampler in ["sequential", "random", "quasi_random"]:
            with self.subTest(sampler=sampler):
                loader = mmtensor.Loader(self.ds, batch_size=64, sampler=sampler, seed=11, num_workers=2)
                self.assertEqual(len(loader), 16)
                seen = []
                for batch in loader:
                    indices = batch.indices.numpy()
                    np.testing.assert_array_equal(batch["image"].numpy(), self.images[indices])
                    np.testing.assert_array_equal(batch["label"].numpy(), indices)
                    tokens = batch["tokens"]
                    for row, i in enumerate(indices):
                        np.testing.assert_array_equal(tokens[row].numpy(), self.tokens[i])
                    seen.extend(indices.tolist())
                self.assertEqual(sorted(seen), list(range(RECORDS)))
                self.assertEqual(loader.epoch, 1)  # the loader moved on to the next epoch

    def test_ctrl_c_in_next_loses_no_batch(self):
        # KeyboardInterrupt while next() gathers (a training loop saving state() on Ctrl-C):
        # next() answers it without taking the batch, or keeps the batch for the next call;
        # either way state() stands before it and the epoch still holds every record once.
        import signal
        import threading
        path = os.path.join(self.dir.name, "slow.mmt")
        values = np.random.default_rng(0).integers(0, 4, (20000, 1024), dtype=np.uint8)
        with mmtensor.DatasetWriter(path, [mmtensor.Field("x", "uint8", [1024]), mmtensor.Field("i", "int64")],
                                    codec="zstd:1", chunk_bytes=65536) as writer:
            writer.append_batch({"x": values, "i": np.arange(20000)})
        loader = mmtensor.Loader(mmtensor.Dataset(path, cache_bytes=0), batch_size=5000, sampler="random",
                                 seed=3, num_workers=1)
        before = json.loads(loader.state())
        timer = threading.Timer(0.005, lambda: os.kill(os.getpid(), signal.SIGINT))
        try:
            with self.assertRaises(KeyboardInterrupt):
                timer.start()  # its signal may come before start() returns: before next(), still inside
                loader.next()
                time.sleep(5)  # had next() returned first, the signal would land here
        finally:
            timer.cancel()
        self.assertEqual(json.loads(loader.state()), before)
        first = loader.next()
        self.assertEqual(first.number, 0)
        seen = [first["i"].numpy().copy()]
        first.release()
        seen += [batch["i"].numpy().copy() for batch in loader]
        np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(20000))

        # A handler of the program's own that raises (a SIGALRM timeout, a SIGTERM of
        # preemption): answered while next() waits, as Ctrl-C is, and nothing is lost (it ran
        # once next() had returned, and its exception dropped the batch state() counted).
        class Preempted(Exception):
            pass

        def preempt(*_):
            raise Preempted()

        loader.set_epoch(1)  # restarted: next() waits for the gather
        before = json.loads(loader.state())
        previous = signal.signal(signal.SIGUSR2, preempt)
        timer = threading.Timer(0.005, lambda: os.kill(os.getpid(), signal.SIGUSR2))
        try:
            with self.assertRaises(Preempted):
                timer.start()
                loader.next()
                time.sleep(5)
        finally:
            timer.cancel()
            signal.signal(signal.SIGUSR2, previous)
        self.assertEqual(json.loads(loader.state()), before)
        # A handler may read the loader while next() waits, not move it. Each try restarts an
        # epoch first, so that next() waits for a gather (a batch already gathered would be
        # returned at once, and the handler run after, where it may move the loader).
        moved, read, outside = [], [], []

        def move(*_):
            read.append(json.loads(loader.state()))
            try:
                loader.next()
                outside.append(True)  # ran outside next() (before it, under load, or after): a void try
            except ValueError as e:
                moved.append(str(e))

        previous = signal.signal(signal.SIGUSR2, move)
        try:
            for attempt in range(20):
                loader.set_epoch(2 + attempt)
                outside.clear()
                timer = threading.Timer(0.005, lambda: os.kill(os.getpid(), signal.SIGUSR2))
                timer.start()
                batch = loader.next()
                timer.join()
                time.sleep(0.01)  # had next() returned first, the handler runs here
                if not outside:
                    self.assertEqual(batch.number, 0)
                del batch
                if moved:
                    break
        finally:
            signal.signal(signal.SIGUSR2, previous)
        self.assertIn("Loader.next: called from a signal handler while next() waits for a batch", moved[0])
        self.assertEqual(read[-1]["epoch"], 2 + attempt)
        self.assertEqual(read[-1]["consumed"], 0)  # before the batch it waited for

        # A handler of another signal (SIGUSR1: checkpoint on preemption) that saves state()
        # runs while next() waits, or once it returns, and may read the loader either way.
        saved = []
        previous = signal.signal(signal.SIGUSR1, lambda *_: saved.append(json.loads(loader.state())))
        try:
            loader.set_epoch(5)
            timer = threading.Timer(0.005, lambda: os.kill(os.getpid(), signal.SIGUSR1))
            timer.start()
            batch = loader.next()
            timer.join()
        finally:
            signal.signal(signal.SIGUSR1, previous)
        self.assertEqual(batch.number, 0)
        self.assertEqual(len(saved), 1)

        # A loader on a daemon thread while the interpreter exits: that thread must not take the
        # GIL back to look for signals (Python ends it there, which aborted the process).
        script = (f"import threading, time, mmtensor\n"
                  f"loader = mmtensor.Loader(mmtensor.Dataset({path!r}, cache_bytes=0), batch_size=5000,\n"
                  f"                         sampler='random', num_workers=1, prefetch_batches=1)\n"
                  f"def run():\n"
                  f"    while True:\n"
                  f"        loader.next()\n"
                  f"threading.Thread(target=run, daemon=True).start()\n"
                  f"time.sleep(0.3)\n")
        for _ in range(3):
            done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
            self.assertEqual(done.returncode, 0, done.stderr[-2000:])

    def test_a_loop_over_the_loader_ends_with_its_epoch(self):
        # An inner loop that runs the epoch out ends the outer one too (the outer ran on into
        # every later epoch, for ever), as does an iterator kept from an epoch set_epoch left.
        loader = mmtensor.Loader(self.ds, batch_size=100, num_workers=1)
        outer = inner = 0
        for batch in loader:
            outer += 1
            for other in loader:
                inner += 1
        self.assertEqual((outer, inner), (1, 9))
        self.assertEqual(loader.epoch, 1)
        stale = iter(loader)
        next(stale)
        loader.set_epoch(5)
        self.assertEqual(sum(1 for _ in stale), 0)
        self.assertEqual(sum(1 for _ in loader), 10)
        # set_epoch() to the epoch a loop is in restarts it: the loop ends there too.
        loop = iter(loader)
        next(loop)
        loader.set_epoch(loader.epoch)
        self.assertEqual(sum(1 for _ in loop), 0)
        self.assertEqual(sum(1 for _ in loader), 10)

    def test_timeout_is_seconds_or_none_or_infinity(self):
        import math
        self.assertEqual(len(list(mmtensor.Loader(self.ds, batch_size=500, timeout=math.inf))), 2)
        for bad in [-1.0, math.nan, -math.inf, 2e9]:
            with self.assertRaisesRegex(ValueError, "timeout must be a number of seconds >= 0 and at most 1e9, or "
                                                    "None \\(or math.inf\\) to wait for ever"):
                mmtensor.Loader(self.ds, batch_size=500, timeout=bad)

    def test_the_last_epoch_ends_and_its_state_resumes(self):
        last = 2**63 - 2
        for drop_last in [False, True]:
            loader = mmtensor.Loader(self.ds, batch_size=400, epoch=last, drop_last=drop_last)
            self.assertEqual(sum(batch.size for batch in loader), 800 if drop_last else RECORDS)
            self.assertIsNone(loader.next())
            self.assertIsNone(loader.next())
            self.assertEqual(loader.epoch, last)
            # At the end, the tail drop_last left out is given up too: a resume that keeps
            # it (drop_last=False) has nothing of this epoch left.
            resumed = mmtensor.Loader(self.ds, batch_size=400, state=loader.state())
            self.assertIsNone(resumed.next())
            resumed.set_epoch(0)
            self.assertEqual(sum(1 for _ in resumed), 3)

    def test_the_order_depends_on_seed_and_epoch_not_on_workers(self):
        a = self.epoch_labels(mmtensor.Loader(self.ds, batch_size=50, sampler="random", seed=4, num_workers=0))
        b = self.epoch_labels(mmtensor.Loader(self.ds, batch_size=50, sampler="random", seed=4, num_workers=3))
        c = self.epoch_labels(mmtensor.Loader(self.ds, batch_size=50, sampler="random", seed=4, epoch=1))
        np.testing.assert_array_equal(a, b)
        self.assertFalse(np.array_equal(a, c))

    def test_a_state_resumes_the_exact_sequence(self):
        options = dict(batch_size=30, sampler="quasi_random", seed=9, num_workers=2)
        whole = self.epoch_labels(mmtensor.Loader(self.ds, **options))
        loader = mmtensor.Loader(self.ds, **options)
        first = [loader.next()["label"].numpy().copy() for _ in range(7)]
        state = loader.state()
        self.assertEqual(json.loads(state)["consumed"], 210)
        del loader
        rest = self.epoch_labels(mmtensor.Loader(self.ds, state=state, **options))
        np.testing.assert_array_equal(np.concatenate(first + [rest]), whole)
        # A dict (json.loads of the text) resumes as well.
        again = self.epoch_labels(mmtensor.Loader(self.ds, state=json.loads(state), **options))
        np.testing.assert_array_equal(again, rest)
        with self.assertRaises(ValueError):  # another seed's order cannot continue this state
            mmtensor.Loader(self.ds, state=state, **dict(options, seed=10))

    def test_a_checkpoint_on_an_epochs_last_batch_resumes_without_repeating_it(self):
        # The loop training scripts write: set_epoch(epoch) at the top, a checkpoint every few
        # steps holding the loader's state and the loop's epoch. One on the epoch's last batch
        # used to resume at epoch + 1's start, and set_epoch(epoch) then ran the epoch again.
        options = dict(batch_size=250, sampler="random", seed=5, num_workers=2)
        reference = mmtensor.Loader(self.ds, **options)
        expected = [self.epoch_labels(reference) for _ in range(3)]
        loader = mmtensor.Loader(self.ds, **options)
        checkpoint = None
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                checkpoint = {"loader": loader.state_dict(), "epoch": epoch}
        self.assertEqual(checkpoint["loader"]["epoch"], 1)
        self.assertEqual(checkpoint["loader"]["consumed"], RECORDS)
        resumed = mmtensor.Loader(self.ds, **options)
        resumed.load_state_dict(checkpoint["loader"])
        seen = []
        for epoch in range(checkpoint["epoch"], 3):
            resumed.set_epoch(epoch)
            seen.append(self.epoch_labels(resumed) if len(resumed) else np.array([], dtype=np.int64))
        self.assertEqual(len(seen[0]), 0)
        np.testing.assert_array_equal(seen[1], expected[2])

    def test_state_dict_and_load_state_dict_move_a_loader_to_a_saved_place(self):
        # The pair checkpoint code calls on anything with state (torchdata's
        # StatefulDataLoader, Lightning): a dict out, and the same loader moved back to it.
        options = dict(batch_size=30, sampler="random", seed=3, num_workers=2)
        loader = mmtensor.Loader(self.ds, **options)
        whole = self.epoch_labels(mmtensor.Loader(self.ds, **options))
        first = [loader.next()["label"].numpy().copy() for _ in range(4)]
        saved = loader.state_dict()
        self.assertIsInstance(saved, dict)
        self.assertEqual(saved, json.loads(loader.state()))
        self.assertEqual(saved["consumed"], 120)
        held = loader.next()  # a batch taken before the move stays valid after it
        held_labels = held["label"].numpy().copy()
        for _ in range(3):
            loader.next()
        loader.load_state_dict(saved)
        self.assertEqual(loader.state_dict(), saved)
        rest = self.epoch_labels(loader)
        np.testing.assert_array_equal(np.concatenate(first + [rest]), whole)
        np.testing.assert_array_equal(held["label"].numpy(), held_labels)
        # Text as state() gives it, into a loader of another epoch: it goes to the saved place.
        other = mmtensor.Loader(self.ds, epoch=5, **options)
        other.next()
        other.load_state_dict(json.dumps(saved))
        self.assertEqual(other.epoch, 0)
        np.testing.assert_array_equal(self.epoch_labels(other), rest)
        # Refused, and the loader left where it was: another order's state, or no state at all.
        other.set_epoch(0)
        other.next()
        before = other.state_dict()
        with self.assertRaisesRegex(ValueError, "seed"):
            other.load_state_dict(mmtensor.Loader(self.ds, **dict(options, seed=4)).state_dict())
        with self.assertRaisesRegex(TypeError, "state_dict"):
            other.load_state_dict([1, 2])
        self.assertEqual(other.state_dict(), before)
        other.close()
        with self.assertRaisesRegex(ValueError, "closed"):
            other.load_state_dict(saved)

    def test_ranks_and_subsets_split_the_epoch(self):
        parts = [self.epoch_labels(mmtensor.Loader(self.ds, batch_size=32, sampler="random", seed=1, rank=r,
                                                   world_size=3, drop_tail=True))
                 for r in range(3)]
        together = np.concatenate(parts)
        self.assertEqual(len(together), 999)
        self.assertEqual(len(np.unique(together)), 999)
        subset = np.arange(0, RECORDS, 7)
        labels = self.epoch_labels(mmtensor.Loader(self.ds, batch_size=16, sampler="random", subset=subset))
        np.testing.assert_array_equal(np.sort(labels), subset)
        with self.assertRaises(ValueError):
            mmtensor.Loader(self.ds, batch_size=16, subset=[RECORDS])
        # Negative entries count from the end, as ds[i] counts them (they were refused).
        last_two = mmtensor.Loader(self.ds, batch_size=2, subset=[-1, -2]).next()
        self.assertEqual(last_two.indices.tolist(), [RECORDS - 1, RECORDS - 2])
        with self.assertRaisesRegex(ValueError, f"subset entry 0 is {-RECORDS - 1}"):
            mmtensor.Loader(self.ds, batch_size=16, subset=[-RECORDS - 1])
        # Past int64 is outside the records too: the same ValueError, not an IndexError.
        for big in ([2**63], [2**70], np.array([2**63], np.uint64)):
            with self.assertRaisesRegex(ValueError, "subset: index .* is out of range"):
                mmtensor.Loader(self.ds, batch_size=16, subset=big)

    def test_a_mixture_draws_each_part_by_its_weight_and_resumes(self):
        # A second file of the same fields, 200 records (labels 1000..1199), beside the first.
        other_path = os.path.join(self.dir.name, "other.mmt")
        fields = [mmtensor.Field("image", "uint8", [4, 4]), mmtensor.Field("label", "int64"),
                  mmtensor.Field("tokens", "int32", [-1])]
        with mmtensor.DatasetWriter(other_path, fields) as writer:
            for i in range(200):
                writer.append({"image": self.images[i], "label": np.int64(RECORDS + i), "tokens": self.tokens[i]})
        both = mmtensor.Dataset([self.path, other_path])
        options = dict(batch_size=50, sampler="random", seed=5, mixture=[0.5, 0.5], epoch_size=800)
        labels = self.epoch_labels(mmtensor.Loader(both, **options))
        self.assertEqual(len(labels), 800)
        small = labels[labels >= RECORDS]
        self.assertEqual(len(small), 400)  # the 200 records of the small file, each twice
        self.assertEqual(np.bincount(small - RECORDS).tolist(), [2] * 200)
        self.assertEqual(len(np.unique(labels[labels < RECORDS])), 400)  # 400 distinct of the 1000
        loader = mmtensor.Loader(both, **options)
        head = np.concatenate([loader.next()["label"].numpy().copy() for _ in range(3)])
        state = loader.state_dict()
        self.assertEqual(state["mixture_size"], 800)
        rest = self.epoch_labels(mmtensor.Loader(both, **options, state=state))
        np.testing.assert_array_equal(np.concatenate([head, rest]), labels)
        with self.assertRaisesRegex(ValueError, "saved with a mixture of 800 positions"):
            mmtensor.Loader(both, **dict(options, mixture=[0.2, 0.8]), state=state)
        # Record ranges: the first 10 records only, three times an epoch, in order.
        ranges = mmtensor.Loader(both, batch_size=30, mixture=[(0, 10, 1.0)], epoch_size=30)
        self.assertEqual(ranges.next()["label"].numpy().tolist(), list(range(10)) * 3)
        with self.assertRaisesRegex(ValueError, "2 part"):
            mmtensor.Loader(both, mixture=[1.0])
        with self.assertRaisesRegex(TypeError, "mixture must be a list of weights"):
            mmtensor.Loader(both, mixture="0.5")
        with self.assertRaisesRegex(ValueError, "give mixture= too"):
            mmtensor.Loader(both, epoch_size=10)
        # Quasi-random over the parts: the same counts, chunk by chunk.
        quasi = self.epoch_labels(mmtensor.Loader(both, batch_size=100, sampler="quasi_random", mixture=[1, 1],
                                                  epoch_size=200))
        self.assertEqual(len(quasi), 200)
        self.assertEqual(int((quasi >= RECORDS).sum()), 100)
        self.assertEqual(len(np.unique(quasi)), 200)  # both parts subsampled: distinct records
        # Entries that are not weights or ranges are named, not cast blindly.
        for bad in ([True, 1.0], [np.bool_(True), 1.0], [1j, 1.0], [(0, 10, True)], [(0.5, 10, 1.0)], [(0, 10, "1")]):
            with self.assertRaisesRegex(TypeError, "entry 0 has a"):
                mmtensor.Loader(both, mixture=bad)
        with self.assertRaisesRegex(ValueError, "is not a finite number"):
            mmtensor.Loader(both, mixture=[10**400, 1.0])
        with self.assertRaisesRegex(ValueError, "are not a range of records"):
            mmtensor.Loader(both, mixture=[(-(2**63), 2**63 - 1, 1.0)])
        ranges_array = mmtensor.Loader(both, batch_size=5, mixture=np.array([[0, 5, 1]]), epoch_size=5)
        self.assertEqual(ranges_array.next()["label"].numpy().tolist(), [0, 1, 2, 3, 4])

    C_TRANSFORMS = r"""
#include <stdint.h>
#include <string.h>
#include <unistd.h>
/* image (uint8 [4, 4]) -> float32 [4, 4]: pixel / 255 */
int32_t scale(const uint8_t* const* in, const int64_t* const* shapes, const int32_t* ndims, int32_t n,
              uint8_t* out, uint64_t seed, int64_t index) {
  if (n != 1 || ndims[0] != 2 || shapes[0][0] != 4 || shapes[0][1] != 4) return 2;
  float* values = (float*)out;
  for (int k = 0; k < 16; ++k) values[k] = in[0][k] / 255.0f;
  return 0;
}
/* tokens (int32, ragged) and label -> int64 [4]: count, sum, label, seed */
int32_t summary(const uint8_t* const* in, const int64_t* const* shapes, const int32_t* ndims, int32_t n,
                uint8_t* out, uint64_t seed, int64_t index) {
  const int32_t* tokens = (const int32_t*)in[0];
  int64_t* values = (int64_t*)out, sum = 0;
  for (int64_t k = 0; k < shapes[0][0]; ++k) sum += tokens[k];
  values[0] = shapes[0][0];
  values[1] = sum;
  values[2] = *(const int64_t*)in[1];
  values[3] = (int64_t)seed;
  return ndims[1] == 0 ? 0 : 3;
}
int32_t fail_on_13(const uint8_t* const* in, const int64_t* const* shapes, const int32_t* ndims, int32_t n,
                   uint8_t* out, uint64_t seed, int64_t index) {
  return index == 13 ? 7 : 0;
}
/* label -> int64: the label, 1.5 s late for record 1 */
int32_t slow_on_1(const uint8_t* const* in, const int64_t* const* shapes, const int32_t* ndims, int32_t n,
                  uint8_t* out, uint64_t seed, int64_t index) {
  if (index == 1) usleep(1500000);
  memcpy(out, in[0], 8);
  return 0;
}
"""

    def transforms_library(self):
        import ctypes
        source = os.path.join(self.dir.name, "transforms.c")
        with open(source, "w") as f:
            f.write(self.C_TRANSFORMS)
        library_path = os.path.join(self.dir.name, "transforms.so")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", library_path, source], check=True)
        return ctypes.CDLL(library_path)

    @unittest.skipUnless(shutil.which("cc"), "no C compiler")
    def test_a_signal_as_next_returns_keeps_the_batch_for_the_next_call(self):
        # A handler that checkpoints state() and raises while next() takes a batch ready at
        # once (no wait, so the engine polls for no signal): the batch is kept for the next
        # call, and the checkpoint stands before it. (Answered only once next() had returned,
        # the handler's exception dropped a batch state() had counted.) Made certain by a
        # second thread whose next() holds the loader through record 1's slow transform while
        # the signal comes: the main thread's next() then finds batch 2 gathered.
        import signal
        import threading
        library = self.transforms_library()
        slow = mmtensor.Transform("slow", inputs=["label"], dtype="int64", shape=[], fn=library.slow_on_1)
        loader = mmtensor.Loader(self.ds, batch_size=1, num_workers=2, prefetch_batches=4, transforms=[slow],
                                 fields=["label"])

        class Preempted(Exception):
            pass

        saved = []

        def checkpoint(*_):
            saved.append(loader.state_dict())
            raise Preempted()

        self.assertEqual(loader.next()["label"].tolist(), [0])
        other = []
        thread = threading.Thread(target=lambda: other.append(loader.next()["label"].tolist()))
        previous = signal.signal(signal.SIGUSR1, checkpoint)
        try:
            thread.start()
            time.sleep(0.05)
            timer = threading.Timer(0.25, lambda: os.kill(os.getpid(), signal.SIGUSR1))
            with self.assertRaises(Preempted):
                timer.start()
                loader.next()
                time.sleep(5)  # had next() returned first, the signal would land here
            thread.join()
        finally:
            timer.cancel()
            signal.signal(signal.SIGUSR1, previous)
        self.assertEqual(other, [[1]])
        self.assertEqual(saved[-1]["consumed"], 2)  # before the kept batch, as state() now
        self.assertEqual(loader.state_dict(), saved[-1])
        self.assertIn("epoch=0", repr(loader))
        self.assertEqual(loader.next()["label"].tolist(), [2])  # the kept batch
        self.assertEqual(loader.state_dict()["consumed"], 3)
        loader.close()

    @unittest.skipUnless(shutil.which("cc"), "no C compiler")
    def test_transforms_in_c_run_on_the_workers(self):
        import ctypes
        library = self.transforms_library()
        scale = mmtensor.Transform("image", inputs=["image"], dtype="float32", shape=[4, 4], fn=library.scale)
        summary = mmtensor.Transform("summary", inputs="tokens label".split(), dtype="int64", shape=[4],
                                     fn=ctypes.cast(library.summary, ctypes.c_void_p).value)  # an address
        self.assertEqual(repr(scale), "<mmtensor.Transform 'image' float32[4, 4]>")
        seeds = None
        for workers in (0, 2):
            loader = mmtensor.Loader(self.ds, batch_size=100, sampler="random", seed=3, transforms=[scale, summary],
                                     fields=["label"], num_workers=workers)  # "label" read by summary, and loaded
            batch = loader.next()
            self.assertEqual(batch.keys(), ["label", "image", "summary"])  # "image" is the transform's
            labels = batch["label"].numpy()
            np.testing.assert_allclose(batch["image"].numpy(), self.images[labels] / 255.0, rtol=1e-6)
            got = batch["summary"].numpy()
            np.testing.assert_array_equal(got[:, 0], [len(self.tokens[i]) for i in labels])
            np.testing.assert_array_equal(got[:, 1], [int(self.tokens[i].sum()) for i in labels])
            np.testing.assert_array_equal(got[:, 2], labels)
            if seeds is None:
                seeds = got[:, 3].copy()
            np.testing.assert_array_equal(got[:, 3], seeds)  # the same whatever the workers
            loader.close()
        failing = mmtensor.Transform("x", inputs=["label"], dtype="int64", shape=[1], fn=library.fail_on_13)
        with self.assertRaisesRegex(mmtensor.Error, "sample 13 .*transform 'x'.*returned 7"):
            list(mmtensor.Loader(self.ds, batch_size=50, transforms=[failing]))
        with self.assertRaisesRegex(TypeError, "fn must be a C function"):
            mmtensor.Transform("x", inputs=["label"], dtype="int64", shape=[1], fn=lambda *a: 0)
        with self.assertRaisesRegex(ValueError, "null function pointer"):
            mmtensor.Transform("x", inputs=["label"], dtype="int64", shape=[1], fn=0)
        with self.assertRaisesRegex(ValueError, r"is not in \[1, 2\*\*64\)"):
            mmtensor.Transform("x", inputs=["label"], dtype="int64", shape=[1], fn=-1)
        # A ctypes callback around a Python function would take the GIL on the workers.
        callback_type = ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * 4, ctypes.c_void_p, ctypes.c_uint64,
                                         ctypes.c_int64)
        with self.assertRaisesRegex(TypeError, "ctypes callback around a Python function"):
            mmtensor.Transform("x", inputs=["label"], dtype="int64", shape=[1], fn=callback_type(lambda *a: 0))
        with self.assertRaisesRegex(TypeError, "mmtensor.Transform objects"):
            mmtensor.Loader(self.ds, transforms=[library.scale])

    def test_a_numba_cfunc_is_a_transform(self):
        try:
            from numba import carray, cfunc, types
        except ImportError:
            self.skipTest("no numba")
        sig = types.int32(types.CPointer(types.CPointer(types.uint8)), types.CPointer(types.CPointer(types.int64)),
                          types.CPointer(types.int32), types.int32, types.CPointer(types.uint8), types.uint64,
                          types.int64)

        @cfunc(sig)
        def invert(inputs, shapes, ndims, count, output, seed, index):
            pixels = carray(inputs[0], (16,))
            values = carray(output, (16,))
            for k in range(16):
                values[k] = 255 - pixels[k]
            return 0
        loader = mmtensor.Loader(self.ds, batch_size=RECORDS, num_workers=2, fields=["label"], transforms=[
            mmtensor.Transform("image", inputs=["image"], dtype="uint8", shape=[4, 4], fn=invert)])
        del invert  # the Transform keeps the compiled function alive
        gc.collect()
        batch = loader.next()
        np.testing.assert_array_equal(batch["image"].numpy(), 255 - self.images[batch["label"].numpy()])

    def test_fields_drop_last_and_options(self):
        loader = mmtensor.Loader(self.ds, batch_size=300, fields=["label"], drop_last=True)
        batches = list(loader)
        self.assertEqual([b.size for b in batches], [300, 300, 300])
        self.assertEqual(batches[0].keys(), ["label"])
        with self.assertRaisesRegex(KeyError, "'label'"):
            batches[0]["image"]
        with self.assertRaises(ValueError):
            mmtensor.Loader(self.ds, batch_size=0)
        with self.assertRaises(ValueError):
            mmtensor.Loader(self.ds, fields=["nope"])
        with self.assertRaises(ValueError):
            mmtensor.Loader(self.ds, sampler="shuffled")
        # One field named alone is a list of one; a seed out of range is named (pybind11 gave
        # its whole overload text for both).
        self.assertEqual(mmtensor.Loader(self.ds, batch_size=10, fields="label").next().keys(), ["label"])
        with self.assertRaisesRegex(TypeError, "fields must be field names"):
            mmtensor.Loader(self.ds, fields=["label", 3])
        # Integers out of their C++ range are named too, and the meaning checked after.
        with self.assertRaisesRegex(ValueError, r"world_size = 2147483648 is out of range"):
            mmtensor.Loader(self.ds, world_size=2**31)
        with self.assertRaisesRegex(ValueError, r"epoch = 9223372036854775808 is out of range"):
            mmtensor.Loader(self.ds, epoch=2**63)
        with self.assertRaisesRegex(ValueError, r"epoch = 9223372036854775808 is out of range"):
            mmtensor.Loader(self.ds).set_epoch(2**63)
        with self.assertRaisesRegex(TypeError, "batch_size must be an int, got float"):
            mmtensor.Loader(self.ds, batch_size=2.0)
        for flag in (True, np.bool_(True)):  # numpy 1.x gives np.bool_ an __index__
            with self.assertRaisesRegex(TypeError, "batch_size must be an int, got (bool|numpy.bool)"):
                mmtensor.Loader(self.ds, batch_size=flag)
        self.assertEqual(len(mmtensor.Loader(self.ds, batch_size=np.int64(100), num_workers=np.int32(2))), 10)
        with self.assertRaisesRegex(ValueError, r"seed must be in \[0, 2\*\*64\), got -1"):
            mmtensor.Loader(self.ds, seed=-1)
        with self.assertRaisesRegex(TypeError, "seed must be an int"):
            mmtensor.Loader(self.ds, seed=1.5)
        first = mmtensor.Loader(self.ds, batch_size=10, sampler="random", seed=np.int64(7)).next()
        again = mmtensor.Loader(self.ds, batch_size=10, sampler="random", seed=7).next()
        np.testing.assert_array_equal(first.indices.numpy(), again.indices.numpy())
        self.assertEqual(mmtensor.Loader(self.ds, batch_size=10, seed=2**64 - 1).next().size, 10)

    def test_a_batch_stays_valid_while_python_views_it(self):
        loader = mmtensor.Loader(self.ds, batch_size=100, sampler="random", seed=2, prefetch_batches=1)
        self.assertEqual(loader.ring_slots, 2)
        first = loader.next()
        kept = first["image"].numpy()
        kept_indices = first.indices.numpy().copy()
        del first
        second = loader.next()["label"].numpy()
        # Both slots are viewed now: the loader says so instead of overwriting one.
        with self.assertRaisesRegex(ValueError, "keep copies"):
            loader.next()
        np.testing.assert_array_equal(kept, self.images[kept_indices])
        del kept, second
        gc.collect()
        self.assertIsNotNone(loader.next())

    def test_release_ends_a_batch(self):
        loader = mmtensor.Loader(self.ds, batch_size=10)
        with loader.next() as batch:
            self.assertEqual(batch.number, 0)
            self.assertEqual(batch.epoch, 0)
            self.assertEqual(batch.device, "cpu")
        with self.assertRaisesRegex(ValueError, "released"):
            batch["label"]
        self.assertIn("released", repr(batch))

    def test_release_lets_the_batch_go_but_not_the_slot_under_live_views(self):
        loader = mmtensor.Loader(self.ds, batch_size=100, sampler="random", seed=8, prefetch_batches=1, num_workers=1)
        with loader.next() as batch:
            kept = batch["image"].numpy()
            indices = batch.indices.numpy().copy()
        for _ in range(6):  # the other slot goes round; the kept one is not refilled
            loader.next()
        np.testing.assert_array_equal(kept, self.images[indices])

    def test_batches_held_by_a_reference_cycle_are_collected_rather_than_refused(self):
        loader = mmtensor.Loader(self.ds, batch_size=10, prefetch_batches=1)
        gc.disable()
        try:
            for _ in range(6):
                cycle = [loader.next()["label"]]
                cycle.append(cycle)  # only the cycle collector frees it
                del cycle
        finally:
            gc.enable()

    def test_a_batch_is_written_back_as_it_came(self):
        path = os.path.join(self.dir.name, "copy.mmt")
        fields = [mmtensor.Field("image", "uint8", [4, 4]), mmtensor.Field("label", "int64"),
                  mmtensor.Field("tokens", "int32", [-1])]
        loader = mmtensor.Loader(self.ds, batch_size=64, sampler="random", seed=3)
        order = []
        with mmtensor.DatasetWriter(path, fields, overwrite=True) as writer:
            for batch in loader:
                writer.append_batch(batch)  # a mapping, its ragged field a RaggedBatch
                order.extend(batch.indices.numpy().tolist())
        copy = mmtensor.Dataset(path)
        self.assertEqual(len(copy), RECORDS)
        for k in [0, 17, RECORDS - 1]:
            np.testing.assert_array_equal(copy[k]["image"].numpy(), self.images[order[k]])
            np.testing.assert_array_equal(copy[k]["tokens"].numpy(), self.tokens[order[k]])

    def test_close_repr_and_with(self):
        with mmtensor.Loader(self.ds, batch_size=10, sampler="random", num_workers=2) as loader:
            self.assertIn("batch_size=10", repr(loader))
            self.assertIn("sampler=random", repr(loader))
            batch = loader.next()
        self.assertIn("closed", repr(loader))
        with self.assertRaisesRegex(ValueError, "closed"):
            loader.next()
        np.testing.assert_array_equal(batch["label"].numpy(), batch.indices.numpy())  # batches outlive it

    def test_a_forked_child_reads_on_while_the_parents_loader_runs(self):
        # torch DataLoader workers and multiprocessing fork by default on Linux: the child of
        # a process whose loader threads are decoding must neither hang nor read wrong bytes.
        if "libasan" in os.environ.get("LD_PRELOAD", ""):
            # GCC 12's AddressSanitizer allocator takes no lock across fork(): the child can
            # hang in malloc on a lock a parent thread held (tests/test_util.h).
            self.skipTest("GCC 12's AddressSanitizer allocator is not fork-safe")
        loader = mmtensor.Loader(self.ds, batch_size=16, sampler="random", num_workers=2, prefetch_batches=4)
        first = loader.next()
        pinned = first["label"].is_pinned()
        pid = os.fork()
        if pid == 0:
            import faulthandler
            import signal
            import traceback
            faulthandler.dump_traceback_later(25)  # where a hung child's Python code waits
            signal.alarm(120)  # the last resort, should the parent be gone
            code = 0
            try:
                with self.assertRaisesRegex(ValueError, "forked from its parent.*Make a new Loader"):
                    loader.next()
                with self.assertRaisesRegex(ValueError, "forked"):
                    len(loader)
                if pinned:  # CUDA keeps pinned pages out of a forked child
                    with self.assertRaisesRegex(ValueError, "pinned memory"):
                        first["label"]
                else:
                    np.testing.assert_array_equal(first["label"].numpy(), first.indices.numpy())
                loader.close()  # lets the parent's loader go without waiting for its threads
                indices = np.arange(0, RECORDS, 7)
                batch = self.ds.get_batch(indices, "image", threads=2)
                np.testing.assert_array_equal(np.asarray(batch), self.images[indices])
                own = mmtensor.Loader(self.ds, batch_size=64, sampler="random", num_workers=2)
                np.testing.assert_array_equal(np.sort(self.epoch_labels(own)), self.labels)
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        self.assertEqual(wait_for_child(pid, 30), 0, "the child failed, or hung (None: its stacks are above)")
        first.release()
        self.assertEqual(len(self.epoch_labels(loader)), RECORDS - 16)  # the parent's goes on
        loader.close()

    def test_cuda_batches_reach_torch_without_a_copy(self):
        if not mmtensor.cuda_is_available():
            self.skipTest("no CUDA device")
        try:
            import torch
        except ImportError:
            self.skipTest("no PyTorch")
        for pin_mapping in (False, True):  # gathered on the host, or copied from the mapping
            loader = mmtensor.Loader(self.ds, batch_size=64, sampler="random", seed=5, device="cuda:0", num_workers=2,
                                     pin_mapping=pin_mapping)
            for batch in loader:
                images = torch.from_dlpack(batch["image"])
                self.assertTrue(images.is_cuda)
                indices = batch.indices.numpy()
                np.testing.assert_array_equal(images.cpu().numpy(), self.images[indices])
            loader.close()

    def test_pin_mapping_needs_a_cuda_device(self):
        with self.assertRaisesRegex(ValueError, "pin_mapping copies records from the file mapping to a CUDA device"):
            mmtensor.Loader(self.ds, batch_size=4, pin_mapping=True)

    def test_cuda_array_interface_names_the_legacy_stream_of_the_current_device(self):
        if not mmtensor.cuda_is_available():
            self.skipTest("no CUDA device")
        # cuda:0 is this thread's current device (nothing selected another): "stream": 1, the
        # legacy stream of that device, which next() ordered after the batch's copy. (With
        # another device current the batch is waited for and no stream is named.)
        loader = mmtensor.Loader(self.ds, batch_size=16, device="cuda:0")
        batch = next(iter(loader))
        interface = batch["image"].__cuda_array_interface__
        self.assertEqual(interface["stream"], 1)
        self.assertEqual(interface["version"], 3)
        loader.close()

    def test_a_cuda_tensor_pickles_back_onto_its_device(self):
        if not mmtensor.cuda_is_available():
            self.skipTest("no CUDA device")
        import pickle
        loader = mmtensor.Loader(self.ds, batch_size=16, device="cuda:0")
        batch = next(iter(loader))
        back = pickle.loads(pickle.dumps(batch["image"]))
        self.assertEqual((back.device, back.dtype, back.shape), (batch["image"].device, batch["image"].dtype,
                                                                 batch["image"].shape))
        np.testing.assert_array_equal(back.cpu().numpy(), self.images[batch.indices.numpy()])
        loader.close()


if __name__ == "__main__":
    unittest.main()
