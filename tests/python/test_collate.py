"""mmtensor.collate and collate_torch: the collate_fn that lets torch's DataLoader batch a
Dataset's samples (its default_collate knows NumPy and torch, not mmtensor.Tensor)."""
import os
import pickle
import tempfile
import unittest

import ctypes

import numpy as np

import mmtensor

RECORDS = 200


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class BFloat16Values:
    """bfloat16 values (float32 rounded toward zero) offered through DLPack, as torch would
    offer a bfloat16 tensor: NumPy has no such type, and these tests run without torch. The
    object and its capsules' structures live as long as the object (tests keep it)."""

    def __init__(self, values):
        values = np.ascontiguousarray(values, dtype=np.float32)
        self.bits = (values.view(np.uint32) >> 16).astype(np.uint16)
        self.shape = (ctypes.c_int64 * values.ndim)(*values.shape)
        self.deleter = _DELETER(lambda managed: None)
        self.kept = []

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU

    def __dlpack__(self, stream=None, **kwargs):
        managed = _DLManagedTensor()
        managed.dl_tensor.data = self.bits.ctypes.data
        managed.dl_tensor.device = _DLDevice(1, 0)
        managed.dl_tensor.ndim = self.bits.ndim
        managed.dl_tensor.dtype = _DLDataType(4, 16, 1)  # kDLBfloat, 16 bits
        managed.dl_tensor.shape = self.shape
        managed.deleter = self.deleter
        self.kept.append(managed)
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(managed), b"dltensor", None)


class CollateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(9)
        cls.images = rng.integers(0, 256, size=(RECORDS, 3, 5, 4), dtype=np.uint8)
        cls.labels = rng.integers(0, 10, size=RECORDS).astype(np.int64)
        cls.tokens = [rng.integers(0, 100, size=int(n)).astype(np.int32) for n in rng.integers(0, 7, size=RECORDS)]
        fields = [mmtensor.Field("image", "uint8", [3, 5, 4], channels_last=True),  # strided views
                  mmtensor.Field("label", "int64"), mmtensor.Field("tokens", "int32", [-1])]
        cls.paths = {}
        for codec in ["none", "lz4"]:
            path = os.path.join(cls.dir.name, codec + ".mmt")
            with mmtensor.DatasetWriter(path, fields, codec=codec, chunk_records=32) as writer:
                writer.append_batch({"image": cls.images, "label": cls.labels, "tokens": cls.tokens})
            cls.paths[codec] = path

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_a_batch_of_samples_becomes_arrays_that_own_their_memory(self):
        for codec, path in self.paths.items():
            with self.subTest(codec=codec):
                ds = mmtensor.Dataset(path)
                indices = [17, 3, 199, 64, 3]
                batch = mmtensor.collate([ds[i] for i in indices])  # what DataLoader does
                self.assertEqual(list(batch), ["image", "label", "tokens", "index"])
                np.testing.assert_array_equal(batch["index"], indices)
                self.assertEqual(batch["image"].shape, (5, 3, 5, 4))
                np.testing.assert_array_equal(batch["image"], self.images[indices])
                np.testing.assert_array_equal(batch["label"], self.labels[indices])
                self.assertEqual(batch["label"].dtype, np.int64)
                for row, i in enumerate(indices):
                    np.testing.assert_array_equal(batch["tokens"][row], self.tokens[i])
                for value in [batch["image"], batch["label"]] + batch["tokens"]:
                    self.assertTrue(value.flags.writeable and value.flags.c_contiguous and value.flags.owndata)
                batch["image"][0] = 0  # a copy: the file is untouched
                np.testing.assert_array_equal(ds[17]["image"].numpy(), self.images[17])
                # DataLoader workers send batches to the main process by pickling them.
                again = pickle.loads(pickle.dumps(batch))
                np.testing.assert_array_equal(again["tokens"][2], self.tokens[199])

    def test_one_sample_alone_comes_back_without_the_batch_dimension(self):
        # DataLoader(batch_size=None) hands collate_fn one sample at a time.
        ds = mmtensor.Dataset(self.paths["lz4"])
        one = mmtensor.collate(ds[42])
        self.assertEqual(list(one), ["image", "label", "tokens", "index"])
        np.testing.assert_array_equal(one["image"], self.images[42])
        self.assertEqual(one["image"].shape, (3, 5, 4))
        self.assertEqual(int(one["label"]), self.labels[42])
        np.testing.assert_array_equal(one["tokens"], self.tokens[42])
        self.assertEqual(int(one["index"]), 42)
        self.assertTrue(one["image"].flags.writeable)

    def test_a_field_named_index_keeps_its_values(self):
        path = os.path.join(self.dir.name, "index.mmt")
        with mmtensor.DatasetWriter(path, [mmtensor.Field("index", "int32")]) as writer:
            writer.append_batch({"index": np.arange(10, 20, dtype=np.int32)})
        ds = mmtensor.Dataset(path)
        batch = mmtensor.collate([ds[0], ds[5]])
        np.testing.assert_array_equal(batch["index"], [10, 15])

    def test_no_samples_or_samples_of_different_datasets_are_refused(self):
        with self.assertRaisesRegex(ValueError, "no samples"):
            mmtensor.collate([])
        other = os.path.join(self.dir.name, "other.mmt")
        with mmtensor.DatasetWriter(other, [mmtensor.Field("x", "float32", [2])]) as writer:
            writer.append_batch({"x": np.zeros((3, 2), np.float32)})
        ds = mmtensor.Dataset(self.paths["none"])
        with self.assertRaisesRegex(ValueError, r"sample 1 \(record 2\) has fields \[Field\('x'"):
            mmtensor.collate([ds[0], mmtensor.Dataset(other)[2]])
        # The same names with another dtype: refused, not cast to sample 0's.
        as_float = os.path.join(self.dir.name, "float_labels.mmt")
        fields = [mmtensor.Field("image", "uint8", [3, 5, 4], channels_last=True),
                  mmtensor.Field("label", "float32"), mmtensor.Field("tokens", "int32", [-1])]
        with mmtensor.DatasetWriter(as_float, fields) as writer:
            writer.append_batch({"image": self.images[:2], "label": np.array([0.5, 1.5], np.float32),
                                 "tokens": self.tokens[:2]})
        with self.assertRaisesRegex(ValueError, "one schema only"):
            mmtensor.collate([ds[0], mmtensor.Dataset(as_float)[1]])
        # A Sample that went through pickle is a dict: named, not an AttributeError on .fields.
        with self.assertRaisesRegex(TypeError, "sample 1 is a dict, not an mmtensor.Sample"):
            mmtensor.collate([ds[0], pickle.loads(pickle.dumps(ds[1]))])

    def test_bfloat16_is_refused_by_numpy_paths_with_an_error_not_an_abort(self):
        path = os.path.join(self.dir.name, "bf16.mmt")
        values = BFloat16Values(np.arange(12, dtype=np.float32).reshape(4, 3) / 4)
        with mmtensor.DatasetWriter(path, [mmtensor.Field("w", "bfloat16", [3])]) as writer:
            writer.append_batch({"w": values})
        ds = mmtensor.Dataset(path)
        t = ds[1]["w"]
        self.assertEqual(t.dtype, "bfloat16")
        np.testing.assert_array_equal(t.float().numpy(), [0.75, 1.0, 1.25])
        # These used to end the process (an exception thrown through pybind11's buffer slot).
        with self.assertRaisesRegex(TypeError, "bfloat16 has no NumPy type"):
            np.asarray(t)
        with self.assertRaises(BufferError):
            memoryview(t)
        with self.assertRaisesRegex(TypeError, "field 'w' is bfloat16.*collate_torch"):
            mmtensor.collate([ds[0], ds[1]])

    def test_collate_torch_makes_what_collate_makes_through_torchs_conversions(self):
        # Runs without PyTorch: a stand-in module with the calls collate_torch makes, each
        # doing what torch's does for CPU data (NumPy in place of torch tensors).
        import sys
        import types
        stand_in = types.SimpleNamespace(from_numpy=lambda a: a, stack=np.stack, from_dlpack=np.from_dlpack,
                                         int64=np.int64, tensor=lambda v, dtype: np.array(v, dtype=dtype))
        real = sys.modules.get("torch")
        sys.modules["torch"] = types.ModuleType("torch")
        sys.modules["torch"].__dict__.update(vars(stand_in))
        try:
            ds = mmtensor.Dataset(self.paths["lz4"])
            samples = [ds[i] for i in [5, 150, 0]]
            got, want = mmtensor.collate_torch(samples), mmtensor.collate(samples)
            one = mmtensor.collate_torch(ds[150])
        finally:
            if real is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = real
        self.assertEqual(list(got), list(want))
        for name in ["image", "label", "index"]:
            np.testing.assert_array_equal(got[name], want[name])
        for a, b in zip(got["tokens"], want["tokens"]):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(one["image"], want["image"][1])
        np.testing.assert_array_equal(one["tokens"], want["tokens"][1])
        self.assertEqual(int(one["index"]), 150)

    def test_torch_dataloader_with_collate_torch(self):
        try:
            import torch
            from torch.utils.data import DataLoader
        except ImportError:
            self.skipTest("no PyTorch")
        ds = mmtensor.Dataset(self.paths["lz4"])
        # Worker processes are forked: not under GCC 12's AddressSanitizer (see test_loader.py).
        workers = 0 if "libasan" in os.environ.get("LD_PRELOAD", "") else 2
        loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers, collate_fn=mmtensor.collate_torch)
        seen = []
        for batch in loader:
            indices = batch["index"].numpy()
            self.assertEqual(batch["image"].dtype, torch.uint8)
            np.testing.assert_array_equal(batch["image"].numpy(), self.images[indices])
            np.testing.assert_array_equal(batch["label"].numpy(), self.labels[indices])
            np.testing.assert_array_equal(batch["tokens"][0].numpy(), self.tokens[indices[0]])
            seen.extend(indices.tolist())
        self.assertEqual(sorted(seen), list(range(RECORDS)))
        path = os.path.join(self.dir.name, "bf16-torch.mmt")
        values = torch.randn(6, 3).to(torch.bfloat16)
        with mmtensor.DatasetWriter(path, [mmtensor.Field("w", "bfloat16", [3])]) as writer:
            writer.append_batch({"w": values})
        bf16 = mmtensor.Dataset(path)
        batch = mmtensor.collate_torch([bf16[i] for i in [4, 1]])
        self.assertTrue(torch.equal(batch["w"], values[[4, 1]]))
        # Complex values go both ways through DLPack: torch tensors in, torch.complex64 out.
        path = os.path.join(self.dir.name, "complex-torch.mmt")
        waves = torch.randn(6, 3, dtype=torch.complex64)
        with mmtensor.DatasetWriter(path, [mmtensor.Field("z", torch.complex64, [3])]) as writer:
            writer.append_batch({"z": waves})
        complex_ds = mmtensor.Dataset(path)
        batch = mmtensor.collate_torch([complex_ds[i] for i in [5, 0]])
        self.assertEqual(batch["z"].dtype, torch.complex64)
        self.assertTrue(torch.equal(batch["z"], waves[[5, 0]]))
        self.assertTrue(torch.equal(torch.from_dlpack(complex_ds[2]["z"]), waves[2]))


if __name__ == "__main__":
    unittest.main()
