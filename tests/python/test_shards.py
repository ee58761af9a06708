"""mmtensor.write_shards(): a user's conversion on several processes, one shard each."""
import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures.process import BrokenProcessPool
import unittest
import unittest.mock

import numpy as np

import mmtensor
from folder_case import FolderTestCase

FIELDS = [mmtensor.Field("x", "float32", [3]), mmtensor.Field("tokens", "int32", [-1]), mmtensor.Field("i", "int64")]


def convert(i):
    """A record of input i; module-level, so that "spawn" workers can unpickle it."""
    return {"x": np.full(3, i, dtype=np.float32), "tokens": np.arange(i % 7, dtype=np.int32), "i": i}


def convert_failing_at_13(i):
    if i == 13:
        raise KeyError("no such image")
    return convert(i)


class NeedsTwoArguments(Exception):
    """An exception of the user's that pickle cannot rebuild (its constructor's arguments)."""

    def __init__(self, path, reason):
        super().__init__("%s: %s" % (path, reason))


def convert_dying_at_5(i):
    if i == 5:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
    return convert(i)


def convert_exiting_at_3(i):
    if i == 3:
        sys.exit("stop")
    return convert(i)


def convert_failing_at_0_or_hanging_deaf(item):
    """item: (marker path, i). Any i but 0 stands for a conversion stuck in a native call,
    where no signal handler runs: it ignores SIGTERM, makes the marker and sleeps; i == 0
    fails once the marker is there."""
    marker, i = item
    if i == 0:
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise KeyError("no such image")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(marker, "w").close()
    time.sleep(120)
    return convert(i)


def convert_failing_with_the_whole_input(i):
    """A UnicodeDecodeError holds the whole input it was decoding: 1 MB here."""
    if i >= 2:
        (b"\xff" * 1000000).decode("utf-8")
    return convert(i)


def convert_raising_unpicklable_at_2(i):
    if i == 2:
        raise NeedsTwoArguments("img2.jpg", "truncated")
    return convert(i)


class WriteShardsTest(FolderTestCase):
    def test_shards_read_as_one_dataset_in_input_order(self):
        for context in ("fork", "spawn", "forkserver"):
            with self.subTest(context=context):
                paths = mmtensor.write_shards(self.path(context + "-{shard:02d}.mmt"), FIELDS, range(50), convert,
                                              shards=4, num_workers=2, codec="lz4", mp_context=context)
                self.assertEqual(paths, [self.path("%s-%02d.mmt" % (context, k)) for k in range(4)])
                ds = mmtensor.Dataset(paths)
                self.assertEqual(len(ds), 50)
                np.testing.assert_array_equal(np.asarray(ds.column("i")), np.arange(50))
                self.assertEqual(list(ds[48]["tokens"].numpy()), list(range(48 % 7)))
                # Shard k holds inputs k*R/N up to (k+1)*R/N, as `mmt pack --shard` cuts them.
                self.assertEqual([len(mmtensor.Dataset(p)) for p in paths], [12, 13, 12, 13])
                self.assertEqual(mmtensor.Dataset(paths[1]).metadata["pack_shard"], "1/4 of 50")
                with self.assertRaisesRegex(ValueError, "shards out of order"):
                    mmtensor.Dataset([paths[1], paths[0]])
                self.assertEqual(sorted(os.listdir(self.dir.name)), sorted(os.path.basename(p) for p in paths))
                for p in paths:
                    os.remove(p)

    def test_records_without_fn_and_shards_of_another_call_are_another_pack(self):
        records = [{"x": np.zeros(3, np.float32), "tokens": [1, 2], "i": k} for k in range(5)]
        a = mmtensor.write_shards(self.path("a{shard}.mmt"), FIELDS, records, num_workers=2)
        b = mmtensor.write_shards(os.fsencode(self.path("b{shard}.mmt")), FIELDS, records, num_workers=2)  # bytes too
        self.assertEqual(len(mmtensor.Dataset(a + b)), 10)  # two packs, each in order
        self.assertNotEqual(mmtensor.Dataset(a[0]).metadata["pack_source"], mmtensor.Dataset(b[0]).metadata["pack_source"])
        np.testing.assert_array_equal(np.asarray(mmtensor.Dataset(a).column("i")), np.arange(5))

    def test_an_error_in_fn_names_the_input_and_leaves_nothing(self):
        with self.assertRaises(KeyError) as caught:
            mmtensor.write_shards(self.path("f{shard}.mmt"), FIELDS, range(40), convert_failing_at_13, shards=3,
                                  num_workers=2)
        self.assertIn("while writing inputs[13] (shard 1 of 3)", "\n".join(getattr(caught.exception, "__notes__", [])))
        self.assertEqual(os.listdir(self.dir.name), [])
        # A record the writer refuses (a wrong shape) is an error of the same kind.
        bad = [{"x": np.zeros(4, np.float32), "tokens": [], "i": 0}]
        with self.assertRaisesRegex(ValueError, "x"):
            mmtensor.write_shards(self.path("g{shard}.mmt"), FIELDS, bad, num_workers=1)
        self.assertEqual(os.listdir(self.dir.name), [])

    def test_a_worker_that_dies_or_exits_is_an_error_not_a_hang(self):
        # multiprocessing.Pool waited forever for the shard a killed worker held.
        with self.assertRaises(BrokenProcessPool):
            mmtensor.write_shards(self.path("k{shard}.mmt"), FIELDS, range(20), convert_dying_at_5, shards=2,
                                  num_workers=2)
        self.assertEqual(os.listdir(self.dir.name), [], "no shard, no partial, no writer's temporary")
        with self.assertRaisesRegex(RuntimeError, "SystemExit: stop") as caught:
            mmtensor.write_shards(self.path("x{shard}.mmt"), FIELDS, range(20), convert_exiting_at_3, num_workers=2)
        self.assertIn("while writing inputs[3]", "\n".join(caught.exception.__notes__))
        with self.assertRaisesRegex(RuntimeError, "NeedsTwoArguments: img2.jpg: truncated") as caught:
            mmtensor.write_shards(self.path("u{shard}.mmt"), FIELDS, range(20), convert_raising_unpicklable_at_2,
                                  num_workers=2)
        self.assertIn("while writing inputs[2]", "\n".join(caught.exception.__notes__))
        self.assertEqual(os.listdir(self.dir.name), [])

    def test_workers_stopped_after_an_error_all_end(self):
        # A worker stopped after another's error (SIGTERM from write_shards, then from the
        # executor) could take the second SIGTERM as an exception of its task and live on,
        # blocked on a queue lock that a killed worker held: the shutdown then waited for it
        # forever (one call in a hundred here). Many calls, in a process of their own, killed
        # whole should they hang.
        here = os.path.dirname(os.path.abspath(__file__))
        script = textwrap.dedent(f'''
            import os, sys
            sys.path.insert(0, {here!r})
            import mmtensor, test_shards
            from concurrent.futures.process import BrokenProcessPool
            for k in range(100):
                for fn, error in ((test_shards.convert_dying_at_5, BrokenProcessPool),
                                  (test_shards.convert_exiting_at_3, RuntimeError)):
                    try:
                        mmtensor.write_shards(sys.argv[1] + "/t{{shard}}.mmt", test_shards.FIELDS, range(20), fn,
                                              num_workers=2)
                    except error:
                        pass
                    else:
                        sys.exit("no error")
            print(os.listdir(sys.argv[1]))
        ''')
        child = subprocess.Popen([sys.executable, "-c", script, self.dir.name], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = child.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the workers too
            child.communicate()
            self.fail("write_shards hung after an error")
        self.assertEqual((child.returncode, out.strip()), (0, "[]"), err[-2000:])

    def test_a_worker_deaf_to_sigterm_is_killed_after_a_grace_period(self):
        # A conversion inside a long native call runs no handler: stopped after another
        # shard's error, it is killed, and its writer's temporary file removed by the parent.
        # The output's name is long: a writer shortens such a name for its temporary file.
        os.mkdir(self.path("out"))
        inputs = [(self.path("deaf"), i) for i in range(4)]
        output = self.path("out/" + "d" * 120 + "{shard}.mmt")
        started = time.monotonic()
        with self.assertRaises(KeyError):
            mmtensor.write_shards(output, FIELDS, inputs, convert_failing_at_0_or_hanging_deaf, shards=2,
                                  num_workers=2)
        self.assertGreater(time.monotonic() - started, 4.5)  # killed, after the grace period
        self.assertLess(time.monotonic() - started, 60)
        self.assertEqual(os.listdir(self.path("out")), [])
        # Ctrl-C while the parent waits out the grace period: the deaf worker is killed all
        # the same, rather than joined for ever.
        os.remove(self.path("deaf"))
        timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
        try:
            with self.assertRaises(KeyboardInterrupt):
                timer.start()
                mmtensor.write_shards(output, FIELDS, inputs, convert_failing_at_0_or_hanging_deaf, shards=2,
                                      num_workers=2)
        finally:
            timer.cancel()
        self.assertEqual(os.listdir(self.path("out")), [])

    def test_an_error_holding_a_whole_input_comes_back_cut(self):
        # Sent whole, a worker stopped in the middle of sending it left the parent waiting
        # for the rest for ever.
        with self.assertRaisesRegex(RuntimeError, "UnicodeDecodeError: 'utf-8' codec can't decode") as caught:
            mmtensor.write_shards(self.path("u{shard}.mmt"), FIELDS, range(40), convert_failing_with_the_whole_input,
                                  shards=4, num_workers=2)
        self.assertLess(len(str(caught.exception)), 3000)
        self.assertIn("while writing inputs[", "\n".join(caught.exception.__notes__))
        self.assertEqual(os.listdir(self.dir.name), [])

    def test_sigterm_to_the_parent_leaves_nothing(self):
        # docker stop, or a scheduler's kill of the main process: the shards written so far
        # were left under their temporary names, and the workers went on.
        script = textwrap.dedent('''
            import sys, time, numpy as np, mmtensor
            def slow(i):  # shard 0 (inputs 0-499) is written at once, the others slowly
                if i >= 500:
                    time.sleep(0.02)
                return {"x": np.zeros(3, np.float32), "tokens": [], "i": i}
            if __name__ == "__main__":
                fields = [mmtensor.Field("x", "float32", [3]), mmtensor.Field("tokens", "int32", [-1]),
                          mmtensor.Field("i", "int64")]
                print("started", flush=True)
                mmtensor.write_shards(sys.argv[1] + "/t{shard}.mmt", fields, range(2000), slow, shards=4, num_workers=2)
        ''')
        with open(self.path("slow.py"), "w") as f:
            f.write(script)
        os.mkdir(self.path("out"))
        with subprocess.Popen([sys.executable, self.path("slow.py"), self.path("out")], stdout=subprocess.PIPE,
                              text=True) as child:  # its pipe closed on the way out
            self.assertEqual(child.stdout.readline().strip(), "started")
            time.sleep(1.0)
            child.send_signal(signal.SIGTERM)
            self.assertEqual(child.wait(timeout=60), 128 + signal.SIGTERM)
        time.sleep(0.5)  # the workers, stopped by the parent, are gone too
        self.assertEqual(os.listdir(self.path("out")), [])

    def test_existing_files_and_bad_arguments_are_refused_before_any_work(self):
        open(self.path("e1.mmt"), "w").close()
        with self.assertRaisesRegex(FileExistsError, "e1.mmt already exists"):
            mmtensor.write_shards(self.path("e{shard}.mmt"), FIELDS, range(10), convert, shards=2)
        self.assertEqual(os.listdir(self.dir.name), ["e1.mmt"])
        paths = mmtensor.write_shards(self.path("e{shard}.mmt"), FIELDS, range(10), convert, shards=2, overwrite=True)
        self.assertEqual(len(mmtensor.Dataset(paths)), 10)
        with self.assertRaisesRegex(ValueError, "must hold {shard}"):
            mmtensor.write_shards(self.path("plain.mmt"), FIELDS, range(10), convert)
        with self.assertRaisesRegex(ValueError, "only {shard} and {shards} are filled in"):
            mmtensor.write_shards(self.path("{}-{shard}.mmt"), FIELDS, range(10), convert, shards=2)
        with self.assertRaisesRegex(ValueError, "the same name"):
            mmtensor.write_shards(self.path("s{shard!s:.0}.mmt"), FIELDS, range(10), convert, shards=2)
        with self.assertRaisesRegex(TypeError, "inputs must be a sequence"):
            mmtensor.write_shards(self.path("i{shard}.mmt"), FIELDS, iter(range(3)), convert)
        with self.assertRaisesRegex(ValueError, "num_workers"):
            mmtensor.write_shards(self.path("i{shard}.mmt"), FIELDS, range(3), convert, num_workers=0)
        # The writer's options and fields, checked once here before any worker starts: the
        # error is this call's own, with no worker's note, and leaves nothing.
        before = sorted(os.listdir(self.dir.name))
        no_pool = unittest.mock.patch.object(concurrent.futures, "ProcessPoolExecutor",
                                             side_effect=AssertionError("a worker pool was started"))
        with no_pool, self.assertRaisesRegex(ValueError, "unknown codec 'lz5'"):
            mmtensor.write_shards(self.path("c{shard}.mmt"), FIELDS, range(4), convert, shards=2, codec="lz5")
        twice = [mmtensor.Field("x", "int64"), mmtensor.Field("x", "int64")]
        with no_pool, self.assertRaisesRegex(ValueError, "already has a field named 'x'"):
            mmtensor.write_shards(self.path("c{shard}.mmt"), twice, range(4), convert)
        self.assertEqual(sorted(os.listdir(self.dir.name)), before)
        with self.assertRaisesRegex(FileNotFoundError, "its folder .*nowhere does not exist"):
            mmtensor.write_shards(self.path("nowhere/i{shard}.mmt"), FIELDS, range(3), convert)
        # A symbolic link at a shard's path is not replaced, even asked to: as DatasetWriter.
        open(self.path("target.mmt"), "w").close()
        os.symlink(self.path("target.mmt"), self.path("l0.mmt"))
        with self.assertRaisesRegex(OSError, "l0.mmt is a symbolic link; only a regular file is replaced"):
            mmtensor.write_shards(self.path("l{shard}.mmt"), FIELDS, range(4), convert, shards=2, overwrite=True)
        self.assertTrue(os.path.islink(self.path("l0.mmt")))
        self.assertFalse(os.path.exists(self.path("l1.mmt")))
        # NumPy integers count as integers; one shard is no shard (no shard keys, as mmt pack).
        one = mmtensor.write_shards(self.path("one{shard}.mmt"), FIELDS, range(3), convert, shards=np.int64(1))
        self.assertNotIn("pack_shard", mmtensor.Dataset(one[0]).metadata)


if __name__ == "__main__":
    sys.exit(unittest.main())
