"""The Python API's Dataset and DatasetWriter, checked against NumPy."""
import gc
import os
import tempfile
import threading
import unittest

import numpy as np

import mmtensor


def write(path, fields, records, **options):
    with mmtensor.DatasetWriter(path, fields, **options) as writer:
        writer.append_batch(records)
    return path


class DatasetTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(5)
        self.images = rng.integers(0, 256, size=(300, 3, 8, 6), dtype=np.uint8)
        self.labels = rng.integers(-5, 5, size=300).astype(np.int64)
        self.weights = rng.standard_normal((300, 4)).astype(np.float16)
        self.flags = rng.integers(0, 2, size=(300, 2)).astype(bool)
        self.fields = [mmtensor.Field("image", "uint8", [3, 8, 6], channels_last=True),
                       mmtensor.Field("label", "int64"),
                       mmtensor.Field("weight", np.float16, [4]),
                       mmtensor.Field("flag", "bool", [2])]
        self.records = {"image": self.images, "label": self.labels, "weight": self.weights, "flag": self.flags}

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def test_every_codec_reads_back_what_was_written(self):
        for codec in ["none", "lz4", "zstd:3"]:
            with self.subTest(codec=codec):
                ds = mmtensor.Dataset(write(self.path(codec + ".mmt"), self.fields, self.records,
                                            codec=codec, chunk_bytes=4096))
                self.assertEqual(len(ds), 300)
                self.assertGreater(ds.num_chunks, 1)
                for i in [0, 1, 77, 299, -1]:
                    sample = ds[i]
                    self.assertEqual(sample.index, i % 300)
                    np.testing.assert_array_equal(sample["image"].numpy(), self.images[i])
                    self.assertEqual(sample["label"].item(), self.labels[i])
                    np.testing.assert_array_equal(np.asarray(sample["weight"]), self.weights[i])
                    np.testing.assert_array_equal(sample["flag"].numpy(), self.flags[i])
                for name, source in self.records.items():
                    np.testing.assert_array_equal(ds.column(name).numpy(), source)
                    np.testing.assert_array_equal(ds.column(name, 10, 20).numpy(), source[10:20])
                ds.verify()

    def test_tensors_and_samples_pickle_and_copy_as_torch_users_expect(self):
        import copy
        import pickle
        ds = mmtensor.Dataset(write(self.path("p.mmt"), self.fields, self.records))
        sample = ds[7]
        for name in ["image", "label", "weight", "flag"]:
            with self.subTest(field=name):
                view = sample[name]  # a view into the file; the image is channels-last
                back = pickle.loads(pickle.dumps(view))
                self.assertEqual((back.dtype, back.shape), (view.dtype, view.shape))
                np.testing.assert_array_equal(back.numpy(), self.records[name][7])
                self.assertTrue(back.is_contiguous())
                self.assertNotEqual(back.data_ptr(), view.data_ptr())  # its values, not its memory
                self.assertEqual(copy.copy(view).data_ptr(), view.data_ptr())  # a view, as torch's
                deep = copy.deepcopy(view)
                self.assertNotEqual(deep.data_ptr(), view.data_ptr())
                np.testing.assert_array_equal(deep.numpy(), self.records[name][7])
        # A Sample travels as a dict of its tensors (a DataLoader worker process sends it so).
        back = pickle.loads(pickle.dumps(sample))
        self.assertEqual(sorted(back), sorted(sample.keys()))
        np.testing.assert_array_equal(back["image"].numpy(), self.images[7])
        # What pickle is given back is checked, not trusted.
        from mmtensor import _rebuild_tensor
        with self.assertRaisesRegex(ValueError, "3 bytes for a tensor of 4"):
            _rebuild_tensor(b"abc", "float32", (1,), "cpu")
        with self.assertRaisesRegex(ValueError, "negative"):
            _rebuild_tensor(b"", "float32", (-1,), "cpu")
        with self.assertRaisesRegex(ValueError, "0 bytes for a tensor of 68719476736"):
            _rebuild_tensor(b"", "float64", (1 << 33,), "cpu")  # refused before 64 GiB is asked for
        with self.assertRaisesRegex(ValueError, "0 or 1"):
            _rebuild_tensor(b"\x05", "bool", (1,), "cpu")
        with self.assertRaisesRegex(mmtensor.CudaError, "is not available"):
            _rebuild_tensor(b"", "float32", (0,), "cuda:99")
        # A file's bool byte other than 0 or 1 reads as true, and travels as 1: it used to
        # pickle, then fail to unpickle (in the DataLoader's main process, not the worker).
        offset = sample["flag"].storage_offset()
        with open(self.path("p.mmt"), "r+b") as f:
            f.seek(offset)
            f.write(b"\x02")
        flag = mmtensor.Dataset(self.path("p.mmt"))[7]["flag"]
        self.assertEqual(bytes(flag)[0], 2)
        self.assertEqual(pickle.loads(pickle.dumps(flag)).tolist(), [True, bool(self.flags[7][1])])

    def test_an_uncompressed_sample_is_a_read_only_view_into_the_file(self):
        path = write(self.path("x.mmt"), self.fields, self.records)
        ds = mmtensor.Dataset(path)
        image = ds[5]["image"]
        self.assertEqual(image.filename, path)
        self.assertTrue(image.is_read_only)
        array = image.numpy()
        self.assertFalse(array.flags.writeable)
        with self.assertRaises(ValueError):
            array[0, 0, 0] = 1
        # Stored channels-last: the logical shape [3, 8, 6] with HWC strides, as in PyTorch.
        self.assertEqual(image.shape, (3, 8, 6))
        self.assertEqual(image.stride(), (1, 18, 3))
        self.assertEqual(array.strides, (1, 18, 3))
        self.assertTrue(ds.column_is_view("label"))
        column = ds.column("label").numpy()
        self.assertTrue(np.shares_memory(column, ds[0]["label"].numpy()) or column.ctypes.data ==
                        ds[0]["label"].numpy().ctypes.data)

    def test_the_buffer_protocol_gives_row_major_bytes_only_of_a_contiguous_view(self):
        ds = mmtensor.Dataset(write(self.path("buffer.mmt"), self.fields, self.records))
        image, weight = ds[3]["image"], ds[3]["weight"]  # image is stored channels-last: strided
        self.assertFalse(image.is_contiguous())
        view = memoryview(image)  # strides given: the view as it lies
        self.assertEqual((view.shape, view.strides), ((3, 8, 6), (1, 18, 3)))
        np.testing.assert_array_equal(np.asarray(image), self.images[3])
        # A consumer that reads the bytes in a row (hashing, writing to a file) must not get
        # them in storage order.
        import hashlib
        with self.assertRaisesRegex(BufferError, "contiguous buffer was asked of a strided view"):
            hashlib.sha256(image)
        self.assertEqual(hashlib.sha256(image.contiguous()).digest(), hashlib.sha256(self.images[3].tobytes()).digest())
        self.assertEqual(hashlib.sha256(weight).digest(), hashlib.sha256(self.weights[3].tobytes()).digest())
        import ctypes
        self.assertTrue(memoryview(weight).readonly)  # a view into the file is never writable
        with self.assertRaisesRegex(TypeError, "not writable"):
            (ctypes.c_char * weight.nbytes).from_buffer(weight)

    def test_views_outlive_the_dataset(self):
        ds = mmtensor.Dataset(write(self.path("x.mmt"), self.fields, self.records, codec="lz4"))
        array = ds[42]["image"].numpy()
        column = ds.column("weight").numpy()
        del ds
        gc.collect()
        np.testing.assert_array_equal(array, self.images[42])
        np.testing.assert_array_equal(column, self.weights)

    def test_get_batch_gathers_any_indices_into_new_or_given_arrays(self):
        ds = mmtensor.Dataset(write(self.path("x.mmt"), self.fields, self.records, codec="zstd", chunk_bytes=2048))
        indices = np.array([299, 0, 5, 5, -2])
        np.testing.assert_array_equal(ds.get_batch(indices, "image", threads=2).numpy(), self.images[indices])
        both = ds.get_batch(list(indices), ["label", "flag"])
        np.testing.assert_array_equal(both["label"].numpy(), self.labels[indices])
        np.testing.assert_array_equal(both["flag"].numpy(), self.flags[indices])
        out = np.zeros((5, 3, 8, 6), np.uint8)
        self.assertIs(ds.get_batch(indices, "image", out=out), out)
        np.testing.assert_array_equal(out, self.images[indices])
        strided = np.zeros((5, 8), np.int64)[:, ::2]  # every other column of a wider buffer
        ds.get_batch(indices, "weight", out=np.zeros((5, 4), np.float16))
        with self.assertRaises(ValueError):
            ds.get_batch(indices, "label", out=strided)  # [5, 4] is not the label's shape [5]
        with self.assertRaises(ValueError):
            ds.get_batch(indices, "image", out=np.zeros((5, 3, 8, 6), np.int16))
        read_only = np.zeros((5,), np.int64)
        read_only.setflags(write=False)
        with self.assertRaises(ValueError):
            ds.get_batch(indices, "label", out=read_only)
        with self.assertRaises(IndexError):
            ds.get_batch([300], "label")
        # A list of fields takes a list or a dict of outputs: one array would be iterated by
        # rows, and a dict's array for a field not gathered would silently stay as it was.
        with self.assertRaisesRegex(TypeError, "out= is a list"):
            ds.get_batch(indices, ["label"], out=np.zeros(5, np.int64))
        with self.assertRaisesRegex(KeyError, "not among the fields gathered"):
            ds.get_batch(indices, ["label"], out={"label": np.zeros(5, np.int64), "weight": np.zeros((5, 4), np.float16)})

    def test_ragged_fields(self):
        rng = np.random.default_rng(1)
        documents = [rng.integers(0, 50000, size=n).astype(np.int32) for n in [3, 0, 17, 1, 400, 9]]
        fields = [mmtensor.Field("tokens", "int32", [-1]), mmtensor.Field.bytes("raw")]
        path = self.path("ragged.mmt")
        with mmtensor.DatasetWriter(path, fields, codec="lz4", chunk_bytes=512) as writer:
            for doc in documents:
                writer.append({"tokens": doc, "raw": doc.tobytes()})  # bytes as read from a file
        ds = mmtensor.Dataset(path)
        self.assertFalse(ds.fields[0].is_fixed)
        for i, doc in enumerate(documents):
            np.testing.assert_array_equal(ds[i]["tokens"].numpy(), doc)
            self.assertEqual(ds[i]["raw"].numpy().tobytes(), doc.tobytes())
        batch = ds.get_ragged_batch([4, 0, 2], "tokens")
        self.assertEqual(len(batch), 3)
        np.testing.assert_array_equal(batch.offsets.numpy(), [0, 400, 403, 420])
        for k, i in enumerate([4, 0, 2]):
            np.testing.assert_array_equal(batch[k].numpy(), documents[i])
        whole = ds.ragged_column("tokens")
        np.testing.assert_array_equal(whole.values.numpy(), np.concatenate(documents))
        with self.assertRaises(ValueError):
            ds.get_batch([0], "tokens")
        # Past int64, an index is out of range as ds[2**63] says, not pybind11's overload text.
        for call in [lambda: batch[2**63], lambda: ds.ragged_column("tokens", 0, 2**63)]:
            with self.assertRaisesRegex(IndexError, "9223372036854775808 is out of range"):
                call()
        with self.assertRaisesRegex(TypeError, "index must be an int, got float"):
            batch[1.0]

    def test_metadata_info_and_chunks(self):
        path = write(self.path("x.mmt"), self.fields, self.records, codec="lz4", chunk_records=64,
                     metadata={"source": "test", "classes": "a,b"})
        ds = mmtensor.Dataset(path)
        self.assertEqual(ds.metadata, {"source": "test", "classes": "a,b"})
        info = ds.info()
        self.assertEqual(info["records"], 300)
        self.assertEqual(info["chunks"], 5)
        self.assertEqual(info["codec"], "lz4")
        self.assertEqual(ds.chunk(1)["first_record"], 64)
        self.assertEqual(ds.chunk_of(130), 2)
        self.assertEqual(ds.fields, self.fields)
        self.assertNotEqual(ds.fingerprint(), 0)

    def test_dlpack_shares_writable_memory_and_copies_a_read_only_file_view(self):
        ds = mmtensor.Dataset(write(self.path("x.mmt"), self.fields, self.records))
        batch = ds.get_batch([3, 4], "image")
        array = np.from_dlpack(batch)
        np.testing.assert_array_equal(array, self.images[[3, 4]])
        self.assertEqual(array.ctypes.data, batch.numpy().ctypes.data)
        self.assertEqual(batch.__dlpack_device__(), (1, 0))
        # DLPack before 1.0 cannot say read-only, and a consumer writing into the file's
        # read-only mapping would crash: such a view is handed over as a copy.
        image = ds[3]["image"]
        copied = np.from_dlpack(image)
        np.testing.assert_array_equal(copied, self.images[3])
        self.assertNotEqual(copied.ctypes.data, image.numpy().ctypes.data)
        with self.assertRaises(BufferError):
            image.__dlpack__(copy=False)
        # dl_device is (device_type, device_id), as __dlpack_device__ gives: another form is a
        # TypeError saying so (a tuple of one raised a bare IndexError).
        batch.__dlpack__(dl_device=(1, 0))
        for device in [(1,), [1, 0], (1.0, 0)]:
            with self.subTest(device=device), self.assertRaisesRegex(TypeError, "device_type, device_id"):
                batch.__dlpack__(dl_device=device)
        with self.assertRaisesRegex(BufferError, "the tensor is on cpu"):
            batch.__dlpack__(dl_device=(2, 0))

    def test_threads_read_one_dataset_at_once(self):
        ds = mmtensor.Dataset(write(self.path("x.mmt"), self.fields, self.records, codec="lz4", chunk_bytes=4096))
        failures = []

        def reader(seed):
            rng = np.random.default_rng(seed)
            for _ in range(30):
                indices = rng.integers(0, 300, size=16)
                if not np.array_equal(ds.get_batch(indices, "image").numpy(), self.images[indices]):
                    failures.append(seed)

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(failures, [])


class ShardsTest(unittest.TestCase):
    """Shards read as one dataset: Dataset([paths]) and mmtensor.concat()."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(3)
        self.x = rng.standard_normal((90, 5)).astype(np.float32)
        self.fields = [mmtensor.Field("x", "float32", [5]), mmtensor.Field("i", "int64"),
                       mmtensor.Field("tokens", "int32", [-1])]
        self.paths = []
        for k, (lo, hi) in enumerate([(0, 40), (40, 40), (40, 90)]):  # the middle shard is empty
            tokens = [np.full(i % 4, i, dtype=np.int32) for i in range(lo, hi)]
            self.paths.append(write(os.path.join(self.dir.name, f"s{k}.mmt"), self.fields,
                                    {"x": self.x[lo:hi], "i": np.arange(lo, hi), "tokens": tokens},
                                    codec="lz4" if k else "none", chunk_records=16))

    def tearDown(self):
        self.dir.cleanup()

    def test_shards_read_as_one_dataset(self):
        import pickle
        ds = mmtensor.Dataset(self.paths, cache_bytes=1 << 20)
        self.assertEqual(len(ds), 90)
        self.assertEqual(ds.paths, self.paths)
        self.assertEqual(ds.path, ", ".join(self.paths))
        self.assertEqual([len(p) for p in ds.parts], [40, 0, 50])
        self.assertEqual(ds.locate(45), (2, 5))
        self.assertEqual(ds.locate(-1), (2, 49))
        self.assertIn("3 parts", repr(ds))
        self.assertEqual(ds[41].index, 41)
        np.testing.assert_array_equal(ds[41]["x"].numpy(), self.x[41])
        np.testing.assert_array_equal(ds[-1]["tokens"].numpy(), np.full(89 % 4, 89, np.int32))
        indices = np.random.default_rng(0).integers(-90, 90, size=200)
        np.testing.assert_array_equal(ds.get_batch(indices, "x", threads=2).numpy(), self.x[indices])
        np.testing.assert_array_equal(ds.get_batch(indices, "i").numpy(), np.arange(90)[indices])
        np.testing.assert_array_equal(ds.column("x").numpy(), self.x)
        np.testing.assert_array_equal(ds.column("x", 30, 60).numpy(), self.x[30:60])
        self.assertEqual([s.index for s in ds[38:42]], [38, 39, 40, 41])
        self.assertEqual(ds.cache_stats()["budget_bytes"], 1 << 20)
        info = ds.info()
        self.assertEqual((info["part_count"], info["codec"], info["records"]), (3, "mixed", 90))  # none, lz4
        last = ds.chunk(ds.num_chunks - 1)
        self.assertEqual((last["part"], last["codec"]), (2, "lz4"))
        self.assertEqual(ds.parts[2].info()["part_count"], 1)
        ds.verify()
        again = pickle.loads(pickle.dumps(ds))
        self.assertEqual(again.paths, self.paths)
        self.assertEqual(again.fingerprint(), ds.fingerprint())
        # Opened by relative paths, then the working folder changes (Hydra does): the pickle
        # names the files that were opened, not the relative paths against the new folder.
        here = os.getcwd()
        try:
            os.chdir(self.dir.name)
            relative = mmtensor.Dataset([os.path.basename(p) for p in self.paths])
            one = mmtensor.Dataset(os.path.basename(self.paths[0]))
            os.chdir("/")
            self.assertEqual(pickle.loads(pickle.dumps(relative)).paths, self.paths)
            self.assertEqual(len(pickle.loads(pickle.dumps(one))), 40)
            self.assertEqual(one.path, os.path.basename(self.paths[0]))  # as given
        finally:
            os.chdir(here)
        with mmtensor.Loader(ds, batch_size=16, sampler="quasi_random", seed=1, num_workers=2) as loader:
            seen = []
            for batch in loader:
                np.testing.assert_array_equal(batch["i"].numpy(), batch.indices)
                seen.extend(batch.indices.tolist())
        self.assertEqual(sorted(seen), list(range(90)))

    def test_concat_joins_open_datasets_and_refuses_mismatched_ones(self):
        a, b = mmtensor.Dataset(self.paths[0]), mmtensor.Dataset(self.paths[2])
        ab = mmtensor.concat([a, b])
        self.assertEqual(len(ab), 90)
        self.assertEqual(ab[40]["i"].item(), 40)
        self.assertEqual(len(mmtensor.concat([ab, a])), 130)  # flattened
        self.assertEqual(mmtensor.concat([a]).path, a.path)
        other = write(os.path.join(self.dir.name, "o.mmt"), [mmtensor.Field("x", "float64", [5])],
                      {"x": np.zeros((2, 5))})
        with self.assertRaisesRegex(ValueError, "part 1 .* has other fields"):
            mmtensor.Dataset([self.paths[0], other])
        with self.assertRaisesRegex(ValueError, "no paths given"):
            mmtensor.Dataset([])
        with self.assertRaises(FileNotFoundError):
            mmtensor.Dataset([self.paths[0], os.path.join(self.dir.name, "missing.mmt")])
        with self.assertRaisesRegex(IndexError, "in 2 parts"):
            ab[90]


class ErrorTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.fields = [mmtensor.Field("x", "float32", [4]), mmtensor.Field("y", "int64")]

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def test_bad_indices_and_names(self):
        path = write(self.path("x.mmt"), self.fields, {"x": np.ones((10, 4), np.float32), "y": np.arange(10)})
        ds = mmtensor.Dataset(path)
        with self.assertRaisesRegex(IndexError, "out of range"):
            ds[10]
        # Names no field has: a lone surrogate (os.fsdecode of a byte that is not UTF-8) and a
        # NUL are looked up and not found, the message showing them escaped and whole.
        self.assertFalse("\udcff" in ds[0])
        with self.assertRaisesRegex(KeyError, r"unknown field '\\\\udcff'; the schema has 'x', 'y'"):
            ds[0]["\udcff"]
        with self.assertRaisesRegex(ValueError, r"unknown field 'x\\x00y'; the schema has 'x', 'y'"):
            ds.get(0, "x\0y")
        self.assertEqual(ds[0].get("\udcff", 5), 5)
        for call in [lambda: ds.get_batch([0], ["\ud800"]), lambda: ds.get(0, "\udcff"), lambda: ds.column("\udcff"),
                     lambda: ds.column_is_view("\udcff"), lambda: ds.ragged_column("\udcff"),
                     lambda: ds.get_ragged_batch([0], "\udcff"),
                     lambda: ds.get_batch([0], ["\udcff"], out={"\udcff": np.zeros((1,), np.int64)})]:
            with self.assertRaisesRegex(ValueError, r"unknown field '\\udcff'|unknown field '\\ud800'"):
                call()
        with self.assertRaisesRegex(KeyError, "'x', 'y'"):
            ds[0]["z"]
        with self.assertRaises(ValueError):
            ds.column("z")
        # Not an index: TypeError naming the type, as a list says it; past int64: IndexError.
        for key in [2.0, "3", None, b"x", {1, 2}, (i for i in range(2)), np.float32(1)]:
            with self.subTest(key=key), self.assertRaises(TypeError):
                ds[key]
        for indices in [5, {1, 2}, "12", (i for i in range(2)), [1.5], b"ab", bytearray(b"ab"), memoryview(b"ab")]:
            with self.subTest(indices=indices), self.assertRaises(TypeError):
                ds.get_batch(indices, "y")
        for indices in [bytearray(b"ab"), memoryview(b"ab")]:  # as b"ab": no records 97 and 98
            with self.subTest(indices=indices), self.assertRaises(TypeError):
                ds[indices]
        # A memoryview a C extension made of raw memory has no base object (it crashed the check).
        import ctypes
        raw = ctypes.create_string_buffer(np.array([1, 2], np.int64).tobytes(), 16)
        from_memory = ctypes.pythonapi.PyMemoryView_FromMemory
        from_memory.restype, from_memory.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
        view = from_memory(ctypes.addressof(raw), 16, 0x100)
        self.assertIsNone(view.obj)
        self.assertEqual(ds.get_batch(view, "y").shape, (16,))  # 16 uint8 indices, as NumPy reads the view
        # NumPy makes float64 of [np.uint64(1), 2]; its items are integers all the same.
        self.assertEqual([s.index for s in ds[[np.uint64(1), 2]]], [1, 2])

        # An object whose __index__ fails (a 0-d float array, a class of one's own): its own
        # error, as a list raises it, not SystemError (and no record read meanwhile).
        class BadIndex:
            def __index__(self):
                raise TypeError("no index here")
        for key in [np.array(3.0), np.array(True), BadIndex()]:
            with self.subTest(key=key), self.assertRaises(TypeError):
                ds[key]
        with self.assertRaisesRegex(TypeError, "no index here"):
            ds[[BadIndex()]]
        with self.assertRaisesRegex(TypeError, "no index here"):
            ds.get_batch([1, BadIndex()], "y")
        for big in [[2**70], np.array([2**63], np.uint64)]:
            with self.assertRaises(IndexError):
                ds[big]
            with self.assertRaises(IndexError):
                ds.get_batch(big, "y")
        # The other integer arguments say which and why, where pybind11 printed its overloads.
        for call, error, text in [(lambda: ds.get(2**63, "y"), IndexError, "index 9223372036854775808 is out of range"),
                                  (lambda: ds.get(True, "y"), TypeError, "index must be an int, got bool"),
                                  (lambda: ds.column("y", 0, 2**63), IndexError, "stop 9223372036854775808"),
                                  (lambda: ds.chunk(2**64), IndexError, "chunk 18446744073709551616"),
                                  (lambda: ds.locate(2**63), IndexError, "out of range"),
                                  (lambda: ds.get_batch([0], "y", threads=2**40), ValueError, "threads = 1099511627776"),
                                  (lambda: mmtensor.Dataset(ds.path, cache_bytes=2**63), ValueError, "cache_bytes = "),
                                  (lambda: mmtensor.pack(self.path("p.mmt"), [ds.path], threads=2**31), ValueError,
                                   "threads = 2147483648 is out of range"),
                                  (lambda: mmtensor.DatasetWriter(self.path("w.mmt"), ds.fields, chunk_bytes=2**63),
                                   ValueError, "chunk_bytes = 9223372036854775808"),
                                  (lambda: mmtensor.DatasetWriter(self.path("w.mmt"), ds.fields, metadata={"k": 5}),
                                   TypeError, "metadata must map str to str; 'k' maps to int 5"),
                                  (lambda: mmtensor.pack(self.path("p.mmt"), [ds.path], metadata=["k"]), TypeError,
                                   "metadata must be a dict of str to str, got list")]:
            with self.subTest(text=text), self.assertRaisesRegex(error, text):
                call()
        self.assertFalse(os.path.exists(self.path("w.mmt")) or os.path.exists(self.path("p.mmt")))
        self.assertEqual(ds.get(np.int64(-1), "y").item(), ds[len(ds) - 1]["y"].item())

    def test_copies_of_views_into_a_file_cut_short_raise_oserror(self):
        # Another program truncates the file under the reader: mmtensor's own copies out of a
        # zero-copy view raise OSError naming the file, where a read of the lost pages would
        # end the process with SIGBUS (only user code reading a view directly still would).
        fields = [mmtensor.Field("x", "float32", [256]), mmtensor.Field("y", "int64")]
        path = write(self.path("cut.mmt"), fields,
                     {"x": np.ones((1000, 256), np.float32), "y": np.arange(1000)})
        ds = mmtensor.Dataset(path)
        x, y = ds[999]["x"], ds[999]["y"]
        kept = ds[0]["x"].clone()
        os.truncate(path, 4096)
        copies = {"clone": x.clone, "float": x.float, "item": y.item, "int": lambda: int(y),
                  "repr": lambda: repr(x), "bytes": lambda: bytes(x), "tolist": x.tolist,
                  "collate": lambda: mmtensor.collate([ds[999]]),
                  "compare": lambda: x == 1.0, "compared with": lambda: kept == x}
        for name, copy in copies.items():
            with self.subTest(name), self.assertRaisesRegex(OSError, "truncated or changed while mapped") as caught:
                copy()
            self.assertIn(path, str(caught.exception))
        # Cut inside a page, the rest of that page reads as zeros (the kernel's), which no
        # fault reveals: verify() names the cut by the file's size rather than as damage.
        os.truncate(path, 4096 + 80)
        with self.assertRaisesRegex(OSError, "is 4176 bytes now, .* when it was opened: it was truncated"):
            ds.verify()

    def test_paths_that_are_not_utf8_open_and_come_back(self):
        # Linux names are bytes: b"caf\xe9.mmt" (Latin-1) is no UTF-8, and os.fsdecode makes
        # "caf\udce9.mmt" of it. Both forms open, and paths come back as os.fsdecode gives them.
        import pickle
        name = os.path.join(os.fsencode(self.dir.name), b"caf\xe9.mmt")
        text = os.fsdecode(name)
        with mmtensor.DatasetWriter(text, self.fields) as writer:
            self.assertEqual(writer.path, text)
            writer.append_batch({"x": np.ones((3, 4), np.float32), "y": np.arange(3)})
        self.assertTrue(os.path.exists(name))
        for path in (name, text, [name]):
            ds = mmtensor.Dataset(path)
            self.assertEqual((ds.path, ds.paths), (text, [text]))
            self.assertEqual(ds[0]["x"].filename, text)
            self.assertIn("caf\\xe9.mmt", repr(ds))
            self.assertEqual(len(pickle.loads(pickle.dumps(ds))), 3)
        with self.assertRaisesRegex(FileNotFoundError, r"missing\\xff\.mmt"):
            mmtensor.Dataset(os.path.join(os.fsencode(self.dir.name), b"missing\xff.mmt"))
        with self.assertRaisesRegex(FileExistsError, r"caf\\xe9\.mmt already exists"):
            mmtensor.DatasetWriter(name, self.fields)
        packed = os.path.join(os.fsencode(self.dir.name), b"packed\xfe.mmt")
        mmtensor.pack(packed, [name])
        self.assertEqual(len(mmtensor.Dataset(packed)), 3)
        # A writer dropped unfinished warns naming the path (the warning failed to decode it).
        import gc
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dropped = mmtensor.DatasetWriter(os.path.join(os.fsencode(self.dir.name), b"dropped\xe9.mmt"), self.fields)
            del dropped
            gc.collect()
        self.assertTrue(any("dropped\\xe9.mmt" in str(w.message) for w in caught), [str(w.message) for w in caught])

    def test_missing_foreign_and_damaged_files(self):
        with self.assertRaises(FileNotFoundError):
            mmtensor.Dataset(self.path("missing.mmt"))
        foreign = self.path("foreign.mmt")
        with open(foreign, "wb") as f:
            f.write(b"not a dataset at all" * 100)
        with self.assertRaises(mmtensor.FormatError):
            mmtensor.Dataset(foreign)
        path = write(self.path("x.mmt"), self.fields, {"x": np.ones((10, 4), np.float32), "y": np.arange(10)},
                     codec="zstd")
        offset = mmtensor.Dataset(path).chunk(0)["file_offset"]
        with open(path, "r+b") as f:
            f.seek(offset + 5)
            byte = f.read(1)
            f.seek(offset + 5)
            f.write(bytes([byte[0] ^ 0x40]))
        with self.assertRaisesRegex(mmtensor.ChecksumError, "chunk 0"):
            mmtensor.Dataset(path)[0]
        self.assertTrue(issubclass(mmtensor.ChecksumError, mmtensor.Error))

    def test_a_failed_write_leaves_no_file(self):
        path = self.path("never.mmt")
        with self.assertRaises(RuntimeError):
            with mmtensor.DatasetWriter(path, self.fields) as writer:
                writer.append({"x": np.zeros(4, np.float32), "y": 1})
                raise RuntimeError("the script failed")
        self.assertFalse(os.path.exists(path))
        self.assertEqual(os.listdir(self.dir.name), [])

    def test_a_writer_dropped_unfinished_warns_that_nothing_was_published(self):
        import warnings
        path = self.path("forgotten.mmt")
        writer = mmtensor.DatasetWriter(path, self.fields)
        writer.append({"x": np.zeros(4, np.float32), "y": 1})
        with self.assertWarnsRegex(ResourceWarning, "forgotten.mmt' was dropped without finish"):
            del writer
            gc.collect()
        self.assertFalse(os.path.exists(path))
        # Finished, aborted or in a with block: nothing to say.
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            done = mmtensor.DatasetWriter(self.path("done.mmt"), self.fields)
            done.finish()
            dropped = mmtensor.DatasetWriter(self.path("dropped.mmt"), self.fields)
            dropped.abort()
            with mmtensor.DatasetWriter(self.path("with.mmt"), self.fields) as writer:
                writer.append({"x": np.zeros(4, np.float32), "y": 1})
            del done, dropped, writer
            gc.collect()
        # A writer that failed (a source cut short under it) has nothing left to finish: its
        # error said so, and dropping it says nothing more.
        src = write(self.path("src.mmt"), [mmtensor.Field("x", "float32", [1 << 16])],
                    {"x": np.ones((1, 1 << 16), np.float32)})
        view = mmtensor.Dataset(src)[0]["x"]
        os.truncate(src, 0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            failed = mmtensor.DatasetWriter(self.path("failed.mmt"), [mmtensor.Field("x", "float32", [1 << 16])])
            with self.assertRaises(OSError):
                failed.append({"x": view})
            del failed
            gc.collect()

    def test_values_of_the_wrong_kind_are_refused(self):
        with mmtensor.DatasetWriter(self.path("x.mmt"), self.fields) as writer:
            with self.assertRaisesRegex(ValueError, "dtype float32"):
                writer.append({"x": np.zeros(4, np.float64), "y": 1})
            with self.assertRaisesRegex(ValueError, "'y' is missing"):
                writer.append({"x": np.zeros(4, np.float32)})
            with self.assertRaisesRegex(ValueError, "unknown|no field"):
                writer.append({"x": np.zeros(4, np.float32), "y": 1, "z": 2})
            with self.assertRaises(ValueError):
                writer.append({"x": np.zeros(5, np.float32), "y": 1})
            writer.append([[1, 2, 3, 4], 7])  # a sequence in schema order, converted
            self.assertEqual(len(writer), 1)
        ds = mmtensor.Dataset(self.path("x.mmt"))
        self.assertEqual(ds[0]["x"].tolist(), [1.0, 2.0, 3.0, 4.0])
        self.assertEqual(int(ds[0]["y"]), 7)
        with self.assertRaisesRegex(FileExistsError, "overwrite=True"):
            mmtensor.DatasetWriter(self.path("x.mmt"), self.fields)
        with self.assertRaises(ValueError):
            mmtensor.DatasetWriter(self.path("y.mmt"), self.fields, codec="gzip")
        with self.assertRaises(TypeError):
            mmtensor.Field("bad", "complex256", [2])


if __name__ == "__main__":
    unittest.main()


class PythonConventionsTest(unittest.TestCase):
    """What a NumPy or PyTorch user does without reading the docs."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.fields = [mmtensor.Field("x", "uint8", [3]), mmtensor.Field("y", "int64")]
        self.x = np.arange(30, dtype=np.uint8).reshape(10, 3)
        self.file = os.path.join(self.dir.name, "x.mmt")
        write(self.file, self.fields, {"x": self.x, "y": np.arange(10)})
        self.ds = mmtensor.Dataset(self.file)

    def tearDown(self):
        self.dir.cleanup()

    def test_scalars_convert_as_torch_converts_them(self):
        path = os.path.join(self.dir.name, "s.mmt")
        fields = [mmtensor.Field("f", "float64"), mmtensor.Field("u", "uint64"), mmtensor.Field("b", "bool"),
                  mmtensor.Field("v", "int64", [3])]
        write(path, fields, {"f": np.array([np.nan, np.inf, 1e30, 2.7]),
                             "u": np.array([2**64 - 1, 0, 5, 1], np.uint64),
                             "b": np.array([True, False, True, False]), "v": np.zeros((4, 3), np.int64)})
        ds = mmtensor.Dataset(path)
        # int() agrees with item() and with Python's int(float); it never wraps.
        with self.assertRaises(ValueError):
            int(ds[0]["f"])
        with self.assertRaises(OverflowError):
            int(ds[1]["f"])
        self.assertEqual(int(ds[2]["f"]), int(1e30))
        self.assertEqual(int(ds[3]["f"]), 2)
        big = ds[0]["u"]
        self.assertEqual((int(big), hex(big)), (2**64 - 1, hex(2**64 - 1)))
        with self.assertRaises(IndexError):
            [10, 20, 30][big]  # 2**64 - 1 is no index of a list, and not -1 either
        self.assertEqual([10, 20, 30][ds[3]["u"]], 20)
        with self.assertRaisesRegex(TypeError, "only integer tensors"):
            [10, 20, 30][ds[3]["f"]]
        # Comparisons by value, element by element, as NumPy and torch compare (they fell back
        # to identity: ds[3]["u"] == 1 was False); hashing stays by identity, as torch's.
        one = ds[3]["u"]
        self.assertTrue(one == 1)
        self.assertFalse(one != 1)
        self.assertTrue(ds[3]["u"] == ds[3]["u"])
        self.assertIn(one, [0, 1])
        self.assertEqual([i for i in range(4) if ds[i]["u"] == 5], [2])
        self.assertTrue((one < 2) and (one <= 1) and (one > 0) and (one >= 1))
        np.testing.assert_array_equal(ds.column("u") == np.array([2**64 - 1, 0, 5, 1], np.uint64), [True] * 4)
        np.testing.assert_array_equal(ds.column("b") != ds.column("b"), [False] * 4)
        self.assertEqual(len({one, ds[3]["u"]}), 2)  # two objects, as two torch tensors are
        # Truth: one element by its value; more are ambiguous, as in torch and NumPy.
        self.assertEqual((bool(ds[0]["b"]), bool(ds[1]["b"]), bool(ds[1]["u"])), (True, False, False))
        with self.assertRaisesRegex(ValueError, "ambiguous"):
            bool(ds[0]["v"])
        with self.assertRaisesRegex(TypeError, "iteration over a 0-d tensor"):
            list(ds[0]["f"])
        self.assertEqual([int(x) for x in ds[0]["v"]], [0, 0, 0])
        # size(dim) and stride(dim), negative from the end.
        column = ds.column("v")
        self.assertEqual((column.size(), column.size(0), column.size(-1)), ((4, 3), 4, 3))
        self.assertEqual((column.stride(0), column.stride(-1)), column.stride())  # records may lie apart
        with self.assertRaisesRegex(IndexError, r"range of \[-2, 1\], but got 2"):
            column.size(2)
        with self.assertRaisesRegex(IndexError, "no dimensions"):
            ds[0]["f"].stride(0)
        with self.assertRaises(TypeError):
            column.size(1.0)

    def test_values_are_converted_only_when_exact(self):
        path = os.path.join(self.dir.name, "w.mmt")
        with mmtensor.DatasetWriter(path, self.fields) as writer:
            with self.assertRaisesRegex(ValueError, "does not fit dtype uint8"):
                writer.append({"x": [300, -1, 0], "y": 1})
            with self.assertRaisesRegex(ValueError, "does not fit dtype int64"):
                writer.append({"x": [1, 2, 3], "y": 3.7})
            with self.assertRaises(ValueError):
                writer.append({"x": [1, 2, 3], "y": np.float64(3.9)})
            with self.assertRaises(TypeError):
                writer.append({"x": [1, 2, 3], "y": "5"})
            with self.assertRaises(ValueError):  # same width, other sign: NumPy would wrap
                writer.append({"x": [1, 2, 3], "y": 2**63})
            writer.append({"x": [1, 2, 3], "y": 3.0})   # exact: taken
            writer.append({"x": b"\x04\x05\x06", "y": True})
            writer.append(self.ds[7])                   # a Sample is a record by name
            self.assertEqual(len(writer), 3)
        copy = mmtensor.Dataset(path)
        self.assertEqual([copy[i]["y"].item() for i in range(3)], [3, 1, 7])
        self.assertEqual(copy[1]["x"].tolist(), [4, 5, 6])
        np.testing.assert_array_equal(copy[2]["x"].numpy(), self.x[7])

    def test_integers_mixed_with_floats_in_a_list_keep_every_digit(self):
        # NumPy makes [2**53 + 1, 2.0] a float64 array, which rounds the int to 2**53: each
        # element is taken as Python holds it instead (the writing API's adversary).
        path = os.path.join(self.dir.name, "mixed.mmt")
        fields = [mmtensor.Field("i", "int64", [2]), mmtensor.Field("u", "uint64", [2])]
        rows = [([2**53 + 1, 2.0], [2**64 - 1, 1.0]), ([2**63 - 1, 0.0], [np.uint64(2**63 + 1), np.float32(4)]),
                ([np.int64(2**62 + 1), True], [0.0, 2.0**60])]
        with mmtensor.DatasetWriter(path, fields) as writer:
            for i, u in rows:
                writer.append({"i": i, "u": u})
            for bad in [{"i": [2**53 + 1, 2.5], "u": [0, 0]}, {"i": [0, 0], "u": [-1, 1.0]},
                        {"i": [2**63, 0.0], "u": [0, 0]}, {"i": [float("inf"), 0], "u": [0, 0]}]:
                with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, "does not fit dtype"):
                    writer.append(bad)
        copy = mmtensor.Dataset(path)
        for k, (i, u) in enumerate(rows):
            self.assertEqual(copy[k]["i"].tolist(), [int(v) for v in i])
            self.assertEqual(copy[k]["u"].tolist(), [int(v) for v in u])

    def test_integers_fit_their_range_and_floats_round(self):
        path = os.path.join(self.dir.name, "n.mmt")
        fields = [mmtensor.Field("u", "uint64"), mmtensor.Field("i", "int32"), mmtensor.Field("f", "float32")]
        with mmtensor.DatasetWriter(path, fields) as writer:
            for bad in [{"u": -1}, {"i": np.uint32(2**32 - 1)}, {"i": 2**31}, {"f": 1e40}, {"i": float("nan")}]:
                with self.subTest(bad=bad), self.assertRaises(ValueError):
                    writer.append(dict({"u": 0, "i": 0, "f": 0.0}, **bad))
            writer.append({"u": 2**64 - 1, "i": -2**31, "f": 0.1})
            writer.append({"u": np.uint8(7), "i": True, "f": float("inf")})
        ds = mmtensor.Dataset(path)
        self.assertEqual([ds[0]["u"].item(), ds[0]["i"].item()], [2**64 - 1, -2**31])
        self.assertAlmostEqual(ds[0]["f"].item(), 0.1, places=6)
        self.assertEqual([ds[1]["u"].item(), ds[1]["i"].item(), ds[1]["f"].item()], [7, 1, float("inf")])

    def test_complex_fields_round_trip_with_numpy(self):
        path = os.path.join(self.dir.name, "complex.mmt")
        z64 = (np.arange(12) - 0.5j * np.arange(12)).astype(np.complex64).reshape(6, 2)
        z128 = np.array([1 + 2j, -3.5j, np.inf - 1j, 0, 2.25, -1 + 1e-300j], np.complex128)
        with mmtensor.DatasetWriter(path, [mmtensor.Field("z", np.complex64, [2]),
                                           mmtensor.Field("w", "complex128")], codec="zstd") as writer:
            writer.append_batch({"z": z64[:4], "w": z128[:4]})
            writer.append({"z": [8 - 4j, 9 - 4.5j], "w": 2.25})  # Python numbers, a real one among them
            writer.append({"z": z64[5], "w": complex(-1, 1e-300)})
            with self.assertRaisesRegex(TypeError, "expected numbers of dtype complex64"):
                writer.append({"z": ["a", "b"], "w": 0})
        ds = mmtensor.Dataset(path)
        self.assertEqual([f.dtype for f in ds.fields], ["complex64", "complex128"])
        np.testing.assert_array_equal(ds.column("z").numpy(), z64)
        np.testing.assert_array_equal(ds.column("w").numpy(), z128)
        self.assertEqual(ds[1]["w"].item(), -3.5j)
        self.assertEqual(complex(ds[0]["w"]), 1 + 2j)
        self.assertEqual(ds.column("w").numpy().dtype, np.complex128)
        out = np.zeros((3, 2), np.complex64)
        ds.get_batch([5, 0, 3], "z", out=out)
        np.testing.assert_array_equal(out, z64[[5, 0, 3]])
        parts = ds[4]["z"]  # views, as torch's t.real and t.imag
        self.assertTrue(parts.is_complex())
        self.assertEqual((parts.real.dtype, parts.real.stride(), parts.imag.storage_offset() - parts.real.storage_offset()),
                         ("float32", (2,), 1))
        np.testing.assert_array_equal(parts.real.numpy(), [8, 9])
        np.testing.assert_array_equal(parts.imag.numpy(), [-4, -4.5])
        with self.assertRaises(ValueError):
            ds[0]["w"].real.imag
        view = memoryview(ds[3]["z"])  # PEP 3118 spells complex "Zf" (NumPy's own code 'F' is refused there)
        self.assertEqual(view.format, "Zf")
        np.testing.assert_array_equal(np.asarray(view), z64[3])
        self.assertEqual(mmtensor.Field("a", "c8").dtype, "complex64")
        self.assertEqual(mmtensor.Field("a", np.dtype("<c16")).dtype, "complex128")

    def test_dtype_names(self):
        self.assertEqual(mmtensor.Field("a", "f4").dtype, "float32")
        self.assertEqual(mmtensor.Field("a", np.int16).dtype, "int16")
        self.assertEqual(mmtensor.Field("a", np.dtype("<u8")).dtype, "uint64")
        self.assertEqual(mmtensor.Field("a", "bfloat16").dtype, "bfloat16")
        # cfloat: complex64 in torch, 128 in NumPy; byte: uint8 in torch, int8 in NumPy
        for ambiguous in ["float", "int", "long", "double", "cfloat", "byte"]:
            with self.assertRaisesRegex(ValueError, "ambiguous"):
                mmtensor.Field("a", ambiguous)
        with self.assertRaises(TypeError):
            mmtensor.Field("a", None)

    def test_slices_lists_and_masks_of_records(self):
        self.assertEqual([s.index for s in self.ds[2:8:3]], [2, 5])
        self.assertEqual([s.index for s in self.ds[[9, 0]]], [9, 0])
        mask = np.zeros(10, bool)
        mask[[1, 4]] = True
        self.assertEqual([s.index for s in self.ds[mask]], [1, 4])
        self.assertEqual(self.ds[np.int64(5)].index, 5)
        self.assertEqual(self.ds[np.array(6)].index, 6)  # 0-d: one index
        self.assertEqual([s.index for s in self.ds[np.array([3])]], [3])  # 1-d: a list, as NumPy reads it
        self.assertEqual([s.index for s in self.ds[self.ds.column("y", 0, 2)]], [0, 1])  # a tensor of indices
        with self.assertRaises(IndexError):
            self.ds[2**70]
        np.testing.assert_array_equal(self.ds.get_batch(mask, "x").numpy(), self.x[[1, 4]])
        with self.assertRaises(IndexError):
            self.ds[np.zeros(3, bool)]
        with self.assertRaises(IndexError):
            self.ds.get_batch(np.array([2**64 - 1], np.uint64), "x")
        np.testing.assert_array_equal(self.ds.column("x", -3).numpy(), self.x[-3:])
        np.testing.assert_array_equal(self.ds.column("x", 2, -2).numpy(), self.x[2:-2])
        # Out of range: refused (a slice would clip), naming the bounds as given; the message
        # showed them counted from the end ("column('x', -990, ...)" for -1000).
        n = len(self.ds)
        with self.assertRaisesRegex(IndexError, rf"column\('x', -1000, None\): records \[{n - 1000}, {n}\) once"):
            self.ds.column("x", -1000)
        with self.assertRaisesRegex(IndexError, r"column\('x', 5, 2\)"):
            self.ds.column("x", 5, 2)

    def test_get_batch_outputs(self):
        out = {"x": np.zeros((2, 3), np.uint8), "y": np.zeros(2, np.int64)}
        self.assertIs(self.ds.get_batch([4, 6], ["x", "y"], out=out), out)
        np.testing.assert_array_equal(out["x"], self.x[[4, 6]])
        np.testing.assert_array_equal(out["y"], [4, 6])
        with self.assertRaises(TypeError):  # NumPy would copy a list: the result would be lost
            self.ds.get_batch([4], "y", out=[0])
        with self.assertRaises(TypeError):
            self.ds.get_batch([4], None)
        with self.assertRaises(TypeError):
            self.ds.get_batch([4], ["x", 3])

    def test_tensors_index_iterate_and_give_their_bytes(self):
        t = self.ds.column("x")
        np.testing.assert_array_equal(t[2], self.x[2])
        np.testing.assert_array_equal(t[:, 1], self.x[:, 1])
        self.assertEqual(len(list(t)), 10)
        self.assertEqual(bytes(self.ds[1]["x"]), bytes([3, 4, 5]))
        view = memoryview(self.ds[1]["x"])
        self.assertTrue(view.readonly)
        self.assertEqual(view.tolist(), [3, 4, 5])
        self.assertNotIn("torch", repr(self.ds[1]["x"]))
        with self.assertRaises(ValueError):
            self.ds[1]["x"].__array__(np.int64, copy=False)
        np.testing.assert_array_equal(np.asarray(self.ds[1]["x"], dtype=np.int64), [3, 4, 5])

    def test_mappings_paths_and_pickling(self):
        import pathlib
        import pickle
        sample = self.ds[3]
        self.assertIsNone(sample.get("z"))
        self.assertEqual(sample.get("y").item(), 3)
        self.assertNotIn(0, sample)
        self.assertEqual(dict(sample).keys(), {"x", "y"})
        self.assertEqual(len(mmtensor.Dataset(pathlib.Path(self.file))), 10)
        with self.assertRaisesRegex(ValueError, "null"):
            mmtensor.Dataset(self.file + "\0x")
        again = pickle.loads(pickle.dumps(mmtensor.Dataset(self.file, cache_bytes=1 << 20)))
        self.assertEqual(again.path, self.file)
        self.assertEqual(again[5]["y"].item(), 5)
        pickled = pickle.dumps(self.ds)
        write(self.file, self.fields, {"x": self.x[::-1].copy(), "y": np.arange(10)}, overwrite=True)
        with self.assertRaisesRegex(ValueError, "no longer what was pickled"):
            pickle.loads(pickled)
        self.assertEqual(pickle.loads(pickle.dumps(self.fields)), self.fields)
        self.assertEqual(len({self.fields[0], mmtensor.Field("x", "uint8", [3])}), 1)
        self.assertNotEqual(self.fields[0], "x")

    def test_ragged_batches_may_be_lists_of_values(self):
        path = os.path.join(self.dir.name, "r.mmt")
        fields = [mmtensor.Field("tokens", "int32", [-1]), mmtensor.Field("label", "int64")]
        docs = [np.arange(n, dtype=np.int32) for n in [2, 0, 5]]
        with mmtensor.DatasetWriter(path, fields) as writer:
            writer.append_batch({"tokens": docs, "label": np.array([7, 8, 9])})
        ds = mmtensor.Dataset(path)
        self.assertEqual(len(ds), 3)
        for i, doc in enumerate(docs):
            np.testing.assert_array_equal(ds[i]["tokens"].numpy(), doc)
            self.assertEqual(ds[i]["label"].item(), 7 + i)

    def _pairs_file(self):
        path = os.path.join(self.dir.name, "pairs.mmt")
        with mmtensor.DatasetWriter(path, [mmtensor.Field("p", "float32", [-1, 2])], overwrite=True) as writer:
            writer.append({"p": np.zeros((2, 2), np.float32)})
            writer.append({"p": np.ones((4, 2), np.float32)})
        return path

    def test_ragged_batches_may_be_jagged(self):
        # Records back to back and offsets, as torch.nested.nested_tensor_from_jagged takes
        # them: one copy for the batch. The same file as the records appended one by one.
        from types import SimpleNamespace
        fields = [mmtensor.Field("tokens", "int32", [-1]), mmtensor.Field("boxes", "float32", [-1, 4]),
                  mmtensor.Field("label", "int64")]
        lengths = [3, 0, 7, 1]
        tokens = np.arange(100, 100 + sum(lengths), dtype=np.int32)
        token_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        boxes = np.arange(4 * sum(lengths), dtype=np.float32).reshape(-1, 4)
        labels = np.array([5, 6, 7, 8])
        one_by_one = os.path.join(self.dir.name, "one.mmt")
        with mmtensor.DatasetWriter(one_by_one, fields, chunk_bytes=64) as writer:
            for i in range(4):
                a, b = token_offsets[i], token_offsets[i + 1]
                writer.append({"tokens": tokens[a:b], "boxes": boxes[a:b], "label": labels[i]})
        jagged = os.path.join(self.dir.name, "jagged.mmt")
        with mmtensor.DatasetWriter(jagged, fields, chunk_bytes=64) as writer:
            writer.append_batch({"tokens": SimpleNamespace(values=tokens, offsets=token_offsets.astype(np.int32)),
                                 "boxes": SimpleNamespace(values=boxes, offsets=token_offsets),
                                 "label": labels})
        with open(one_by_one, "rb") as a, open(jagged, "rb") as b:
            self.assertEqual(a.read(), b.read())
        # A RaggedBatch read back goes in as it is (its offsets count elements: [-1, 4] rows
        # are regrouped), and so do a torch nested tensor's parts.
        ds = mmtensor.Dataset(jagged)
        copy = os.path.join(self.dir.name, "copy.mmt")
        with mmtensor.DatasetWriter(copy, fields, chunk_bytes=64) as writer:
            writer.append_batch({"tokens": ds.get_ragged_batch([0, 1, 2, 3], "tokens"),
                                 "boxes": ds.get_ragged_batch([0, 1, 2, 3], "boxes"), "label": labels})
        with open(one_by_one, "rb") as a, open(copy, "rb") as b:
            self.assertEqual(a.read(), b.read())
        with mmtensor.DatasetWriter(os.path.join(self.dir.name, "bad.mmt"), fields) as writer:
            with self.assertRaisesRegex(ValueError, "field 'tokens'.*offsets decrease"):
                writer.append_batch({"tokens": SimpleNamespace(values=tokens, offsets=np.array([0, 5, 2, 9, 11])),
                                     "boxes": SimpleNamespace(values=boxes, offsets=token_offsets), "label": labels})
            # Flat values are regrouped only from a RaggedBatch, whose shapes say how.
            with self.assertRaisesRegex(ValueError, "field 'boxes'.*expected its values back to back"):
                writer.append_batch({"tokens": SimpleNamespace(values=tokens, offsets=token_offsets),
                                     "boxes": SimpleNamespace(values=boxes.ravel(), offsets=token_offsets),
                                     "label": labels})
            pairs = mmtensor.Dataset(self._pairs_file()).get_ragged_batch([0, 1], "p")
            with self.assertRaisesRegex(ValueError, r"record 0 of the RaggedBatch has shape \[2, 2\]"):
                writer.append_batch({"tokens": SimpleNamespace(values=tokens[:4], offsets=token_offsets[:3]),
                                     "boxes": pairs, "label": labels[:2]})
            self.assertEqual(len(writer), 0)
        try:
            import torch
        except ImportError:
            return
        nested = torch.nested.nested_tensor_from_jagged(torch.from_numpy(tokens), torch.from_numpy(token_offsets))
        torch_file = os.path.join(self.dir.name, "torch.mmt")
        with mmtensor.DatasetWriter(torch_file, fields, chunk_bytes=64) as writer:
            writer.append_batch({"tokens": nested, "boxes": SimpleNamespace(values=boxes, offsets=token_offsets),
                                 "label": labels})
        with open(one_by_one, "rb") as a, open(torch_file, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_a_list_and_a_jagged_field_go_in_one_batch_and_errors_name_what(self):
        # One ragged field given as a list of records, another jagged beside it: record by
        # record, the jagged one's records slices of its values; the same file as append().
        from types import SimpleNamespace
        fields = [mmtensor.Field("tokens", "int32", [-1]), mmtensor.Field("image", "uint8", [-1, -1, 3]),
                  mmtensor.Field("label", "int64")]
        tokens = np.arange(10, dtype=np.int32)
        offsets = np.array([2, 5, 5, 9])  # need not start at 0
        images = [np.full((k + 1, 2, 3), k, np.uint8) for k in range(3)]
        one = os.path.join(self.dir.name, "one.mmt")
        with mmtensor.DatasetWriter(one, fields) as writer:
            for k in range(3):
                writer.append({"tokens": tokens[offsets[k]:offsets[k + 1]], "image": images[k], "label": k})
        mixed = os.path.join(self.dir.name, "mixed.mmt")
        with mmtensor.DatasetWriter(mixed, fields) as writer:
            writer.append_batch({"tokens": SimpleNamespace(values=tokens, offsets=offsets), "image": images,
                                 "label": np.arange(3)})
            for bad, error in [({"tokens": SimpleNamespace(values=tokens, offsets=np.array([0, 5, 3, 9])),
                                 "image": images, "label": np.arange(3)}, "field 'tokens': its offsets must be 4"),
                               ({"tokens": [tokens[:2]], "image": SimpleNamespace(values=images[0], offsets=[0, 1]),
                                 "label": [0]}, r"field 'image' is \[-1, -1, 3\]: values and offsets"),
                               ({"tokens": [[1], [2, 3]], "image": images[:2], "label": [[0], [1, 2]]},
                                "record 3, field 'label'"),
                               (5, "batch from record 3: expected a dict of field name to value")]:
                with self.subTest(error=error), self.assertRaisesRegex((ValueError, TypeError), error):
                    writer.append_batch(bad)
            with self.assertRaisesRegex(TypeError, "record 3: expected a dict"):
                writer.append(None)
        with open(one, "rb") as a, open(mixed, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_big_endian_and_oddly_strided_arrays_are_written_as_their_values(self):
        # The writer copies values anyway: an array no tensor views (the other byte order, a
        # field of a packed structured array) is made native and contiguous first.
        packed = np.zeros(4, dtype=[("a", "i1"), ("b", "<i4")])
        packed["b"] = [7, -8, 9, 2**31 - 1]
        fields = [mmtensor.Field("b", "int32", [2]), mmtensor.Field("f", "float64", [2])]
        path = os.path.join(self.dir.name, "odd.mmt")
        with mmtensor.DatasetWriter(path, fields) as writer:
            writer.append({"b": packed["b"][:2], "f": np.array([1.5, -2.25], ">f8")})
            writer.append_batch({"b": packed["b"].reshape(2, 2)[1:], "f": np.array([[3.0, 4.0]], ">f8")})
        ds = mmtensor.Dataset(path)
        self.assertEqual((ds[0]["b"].tolist(), ds[0]["f"].tolist()), ([7, -8], [1.5, -2.25]))
        self.assertEqual((ds[1]["b"].tolist(), ds[1]["f"].tolist()), ([9, 2**31 - 1], [3.0, 4.0]))

    def test_threads_sharing_a_writer_take_turns(self):
        path = os.path.join(self.dir.name, "t.mmt")
        with mmtensor.DatasetWriter(path, self.fields, codec="lz4", chunk_records=7) as writer:
            def append():
                for _ in range(50):
                    writer.append_batch({"x": self.x, "y": np.arange(10)})
            threads = [threading.Thread(target=append) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        ds = mmtensor.Dataset(path)
        self.assertEqual(len(ds), 2000)
        ds.verify()

    def test_a_daemon_thread_inside_the_engine_at_exit_does_not_abort_the_process(self):
        import subprocess
        import sys
        script = (
            "import threading, numpy as np, mmtensor\n"
            f"ds = mmtensor.Dataset({self.file!r})\n"
            "def read():\n"
            "    while True:\n"
            "        ds.get_batch(np.arange(10), 'x', threads=2)\n"
            "threading.Thread(target=read, daemon=True).start()\n"
            "import time; time.sleep(0.2)\n")
        for _ in range(3):
            done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ), capture_output=True, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr.decode())
        # The same while the engine call is throwing (a damaged file): the error must not be
        # in flight when the thread is ended.
        with open(self.file, "r+b") as f:
            f.seek(mmtensor.Dataset(self.file).chunk(0)["file_offset"])
            f.write(b"\xff" * 8)
        failing = script.replace("ds.get_batch(np.arange(10), 'x', threads=2)",
                                 "\n        try:\n            ds.verify()\n        except mmtensor.Error:\n            pass")
        for _ in range(5):
            done = subprocess.run([sys.executable, "-c", failing], env=dict(os.environ), capture_output=True, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr.decode())


class ForeignTensorTest(unittest.TestCase):
    """Tensors of other libraries (torch) reach mmtensor through DLPack; NumPy stands in."""

    class Producer:
        """A DLPack producer that is not a NumPy array, as a torch CPU tensor is."""

        def __init__(self, array):
            self.array = array

        def __dlpack__(self, stream=None):
            return self.array.__dlpack__()

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "d.mmt")

    def tearDown(self):
        self.dir.cleanup()

    def test_dlpack_values_are_written_and_dlpack_outputs_filled_in_place(self):
        fields = [mmtensor.Field("x", "int16", [2, 3]), mmtensor.Field("y", "float32")]
        x = np.arange(24, dtype=np.int16).reshape(4, 2, 3)
        with mmtensor.DatasetWriter(self.path, fields) as writer:
            writer.append_batch({"x": self.Producer(x), "y": self.Producer(np.ones(4, np.float32))})
            writer.append({"x": self.Producer(x[0].T.copy().T), "y": 2.0})  # Fortran-order strides
            with self.assertRaisesRegex(ValueError, "expected dtype int16"):
                writer.append({"x": self.Producer(x[0].astype(np.int32)), "y": 1.0})
        ds = mmtensor.Dataset(self.path)
        np.testing.assert_array_equal(ds.column("x").numpy()[:4], x)
        np.testing.assert_array_equal(ds[4]["x"].numpy(), x[0])
        out = np.zeros((2, 2, 3), np.int16)
        ds.get_batch([3, 1], "x", out=self.Producer(out))
        np.testing.assert_array_equal(out, x[[3, 1]])
