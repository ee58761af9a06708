"""mmtensor.pack(): the packer of `mmt pack` from Python."""
import contextlib
import gzip
import io
import json
import os
import signal
import struct
import tarfile
import threading
import unittest
import zlib

import numpy as np

import mmtensor
from folder_case import FolderTestCase

FASHION = "/usr/share/datasets/fashion-mnist"


@contextlib.contextmanager
def sigint_after(seconds):
    """SIGINT to this process after `seconds` (a Ctrl-C in the middle of the call made
    inside), cancelled on the way out if it has not come. Enter it inside the assertRaises
    that expects the KeyboardInterrupt: on a loaded machine the signal may come while
    timer.start() still waits for its thread."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class PackTest(FolderTestCase):
    def test_arrays_from_npy_and_npz(self):
        x = np.arange(60, dtype=np.float32).reshape(20, 3)
        y = np.arange(20, dtype=np.int16)
        np.save(self.path("x.npy"), x)
        np.savez_compressed(self.path("more.npz"), y=y)
        stats = mmtensor.pack(self.path("a.mmt"), {"x": self.path("x.npy")}, codec="zstd")
        self.assertEqual(stats["records"], 20)
        np.testing.assert_array_equal(mmtensor.Dataset(self.path("a.mmt")).column("x").numpy(), x)
        mmtensor.pack(self.path("b.mmt"), ["x=" + self.path("x.npy"), self.path("more.npz")])
        ds = mmtensor.Dataset(self.path("b.mmt"))
        np.testing.assert_array_equal(ds.column("y").numpy(), y)
        with self.assertRaisesRegex(FileExistsError, "overwrite=True"):
            mmtensor.pack(self.path("b.mmt"), ["x=" + self.path("x.npy")])
        with self.assertRaises(FileNotFoundError):
            mmtensor.pack(self.path("c.mmt"), {"x": self.path("missing.npy")})
        self.assertFalse(os.path.exists(self.path("c.mmt")))
        with self.assertRaises(ValueError):
            mmtensor.pack(self.path("c.mmt"))
        for name in ["a=b", "", "a/b"]:  # joined into NAME=PATH, they would be read as paths
            with self.assertRaisesRegex(ValueError, "field name"):
                mmtensor.pack(self.path("c.mmt"), {name: self.path("x.npy")})

    def test_shards_packed_apart_read_as_the_whole(self):
        x = np.arange(60, dtype=np.float32).reshape(20, 3)
        np.save(self.path("x.npy"), x)
        paths = [self.path(f"part-{k}.mmt") for k in range(3)]
        for k, path in enumerate(paths):
            stats = mmtensor.pack(path, {"x": self.path("x.npy")}, shard=(k, 3), codec="lz4")
            self.assertEqual(stats["records"], [6, 7, 7][k])
        np.testing.assert_array_equal(mmtensor.Dataset(paths).column("x").numpy(), x)
        with self.assertRaisesRegex(ValueError, "shards out of order"):  # as `ls` sorts part-10 before part-2
            mmtensor.Dataset([paths[1], paths[0], paths[2]])
        with self.assertRaisesRegex(ValueError, "shard 3 of 3"):
            mmtensor.pack(self.path("bad.mmt"), {"x": self.path("x.npy")}, shard=(3, 3))
        with self.assertRaisesRegex(ValueError, "shard -1 of 3"):  # refused before the inputs are read
            mmtensor.pack(self.path("bad.mmt"), {"x": self.path("missing.npy")}, shard=(-1, 3))
        self.assertFalse(os.path.exists(self.path("bad.mmt")))

    def test_a_class_folder(self):
        for cls, names in {"cat": ["a.jpg", "b.jpg"], "dog": ["c.jpg"]}.items():
            os.makedirs(self.path(os.path.join("photos", cls)))
            for name in names:
                with open(self.path(os.path.join("photos", cls, name)), "wb") as f:
                    f.write(name.encode() * 3)
        mmtensor.pack(self.path("p.mmt"), folder=self.path("photos"), codec="lz4")
        ds = mmtensor.Dataset(self.path("p.mmt"))
        self.assertEqual(len(ds), 3)
        self.assertEqual(ds.metadata["classes"], '["cat","dog"]')
        self.assertEqual(sorted((bytes(s["data"]), s["label"].item()) for s in ds),
                         [(b"a.jpga.jpga.jpg", 0), (b"b.jpgb.jpgb.jpg", 0), (b"c.jpgc.jpgc.jpg", 1)])

    def test_datasets_repack_merged_with_some_fields(self):
        np.save(self.path("x.npy"), np.arange(40, dtype=np.float32).reshape(10, 4))
        np.save(self.path("y.npy"), np.arange(10))
        parts = [self.path("p%d.mmt" % k) for k in range(2)]
        for k, part in enumerate(parts):
            mmtensor.pack(part, {"x": self.path("x.npy"), "y": self.path("y.npy")}, shard=(k, 2))
        stats = mmtensor.pack(self.path("all.mmt"), parts, codec="lz4", fields="y")  # one field alone
        self.assertEqual(stats["records"], 10)
        ds = mmtensor.Dataset(self.path("all.mmt"))
        self.assertEqual([f.name for f in ds.fields], ["y"])
        np.testing.assert_array_equal(np.asarray(ds.column("y")), np.arange(10))
        self.assertNotIn("pack_shard", ds.metadata)
        with self.assertRaisesRegex(ValueError, "unknown field 'z'"):
            mmtensor.pack(self.path("bad.mmt"), parts, fields=["z"])
        with self.assertRaisesRegex(ValueError, "choosing fields is for dataset inputs"):
            mmtensor.pack(self.path("bad.mmt"), {"x": self.path("x.npy")}, fields=["x"])
        self.assertFalse(os.path.exists(self.path("bad.mmt")))

    def test_folder_paths_and_a_folder_of_files_alone(self):
        for rel in ["photos/cat/a.jpg", "photos/dog/b.jpg", "plain/1.bin", "plain/2.bin"]:
            os.makedirs(os.path.dirname(self.path(rel)), exist_ok=True)
            with open(self.path(rel), "wb") as f:
                f.write(rel.encode())
        mmtensor.pack(self.path("p.mmt"), folder=self.path("photos"), paths=True)
        ds = mmtensor.Dataset(self.path("p.mmt"))
        self.assertEqual([f.name for f in ds.fields], ["data", "label", "path"])
        self.assertEqual([(bytes(s["path"]).decode(), s["label"].item()) for s in ds], [("cat/a.jpg", 0), ("dog/b.jpg", 1)])
        mmtensor.pack(self.path("u.mmt"), folder=self.path("plain"))
        unlabeled = mmtensor.Dataset(self.path("u.mmt"))
        self.assertEqual([bytes(s["data"]) for s in unlabeled], [b"plain/1.bin", b"plain/2.bin"])
        self.assertEqual(list(unlabeled[0].keys()), ["data"])
        self.assertNotIn("classes", unlabeled.metadata)
        with self.assertRaisesRegex(ValueError, "paths=True stores the path"):
            mmtensor.pack(self.path("x.mmt"), {"x": self.path("x.npy")}, paths=True)

    def test_webdataset_shards_of_every_tar_format(self):
        # Python's tarfile writes the three formats WebDataset shards come in; a long key needs
        # a GNU long name or a pax path.
        expected = []
        for n, fmt in enumerate([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]):
            with tarfile.open(self.path(f"shard-{n}.tar"), "w", format=fmt) as tar:
                for i in range(4):
                    key = f"{n}/" + ("k" * 120 if fmt != tarfile.USTAR_FORMAT else "") + f"{i:03d}"
                    for ext, data in [("JPG", bytes([n, i]) * (i + 1)), ("cls", f"{i}\n".encode()),
                                      ("txt", f"caption {n} {i}".encode())]:
                        member = tarfile.TarInfo(f"{key}.{ext}")
                        member.size = len(data)
                        tar.addfile(member, io.BytesIO(data))
                    expected.append((key, bytes([n, i]) * (i + 1), i, f"caption {n} {i}"))
        shards = [self.path(f"shard-{n}.tar") for n in range(3)]
        stats = mmtensor.pack(self.path("w.mmt"), shards, keys=True, codec="lz4")
        self.assertEqual(stats["records"], 12)
        ds = mmtensor.Dataset(self.path("w.mmt"))
        self.assertEqual([f.name for f in ds.fields], ["cls", "jpg", "txt", "__key__"])
        self.assertEqual(ds.metadata["source"], "webdataset")
        got = [(bytes(s["__key__"]).decode(), bytes(s["jpg"]), s["cls"].item(), bytes(s["txt"]).decode()) for s in ds]
        self.assertEqual(got, expected)
        loader = mmtensor.Loader(ds, batch_size=12, fields=["cls"], sampler="random", seed=1)
        self.assertEqual(sorted(loader.next()["cls"].numpy().tolist()), sorted([i for _ in range(3) for i in range(4)]))
        with self.assertRaisesRegex(ValueError, "keys=True stores the key"):
            mmtensor.pack(self.path("x.mmt"), folder=self.path("."), keys=True)
        # A .tar.gz as tarfile writes it reads as the archive it holds.
        with tarfile.open(self.path("shard-1.tar")) as source, tarfile.open(self.path("s.tar.gz"), "w:gz") as tar:
            for member in source.getmembers():
                tar.addfile(member, source.extractfile(member))
        mmtensor.pack(self.path("gz.mmt"), [self.path("s.tar.gz")], keys=True)
        gz = mmtensor.Dataset(self.path("gz.mmt"))
        self.assertEqual([bytes(s["jpg"]) for s in gz], [e[1] for e in expected[4:8]])
        # Fields chosen by extension (alternatives joined by ';'), samples lacking one skipped.
        with tarfile.open(self.path("uneven.tar"), "w") as tar:
            for key, members in [("a", {"jpg": b"J", "cls": b"0"}), ("b", {"png": b"P", "cls": b"1"}),
                                 ("c", {"cls": b"2", "txt": b"T"})]:
                for ext, data in members.items():
                    member = tarfile.TarInfo(f"{key}.{ext}")
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))
        stats = mmtensor.pack(self.path("u.mmt"), [self.path("uneven.tar")], extensions=["jpg;png", "cls"], missing="skip")
        self.assertEqual(stats["records"], 2)
        u = mmtensor.Dataset(self.path("u.mmt"))
        self.assertEqual([bytes(s["jpg"]) for s in u], [b"J", b"P"])
        with self.assertRaisesRegex(ValueError, "missing= takes"):
            mmtensor.pack(self.path("x.mmt"), [self.path("uneven.tar")], missing="maybe")
        with open(self.path("x.tar.bz2"), "wb") as f:
            f.write(b"BZh9" + bytes(600))
        with self.assertRaisesRegex(ValueError, "decompress it first"):
            mmtensor.pack(self.path("x.mmt"), [self.path("x.tar.bz2")])

    def test_token_windows_over_documents_with_a_separator(self):
        docs = [np.arange(n, dtype=np.int32) + 100 * n for n in [3, 0, 5, 2, 7, 1]]
        fields = [mmtensor.Field("tokens", "int32", [-1]), mmtensor.Field("n", "int64")]
        with mmtensor.DatasetWriter(self.path("docs.mmt"), fields, codec="zstd") as writer:
            for d in docs:
                writer.append({"tokens": d, "n": len(d)})
        stats = mmtensor.pack(self.path("w.mmt"), [self.path("docs.mmt")], fields="tokens", window=5, window_stride=4,
                              separator=-1)
        stream = np.concatenate([np.append(d, -1) for d in docs])
        windows = [stream[s:s + 5] for s in range(0, len(stream) - 4, 4)]
        self.assertEqual(stats["records"], len(windows))
        ds = mmtensor.Dataset(self.path("w.mmt"))
        np.testing.assert_array_equal(ds.get_batch(np.arange(len(ds)), "tokens"), np.stack(windows))
        self.assertEqual(json.loads(ds.metadata["token_windows"])["separator"], -1)
        with self.assertRaisesRegex(ValueError, "give window= too"):
            mmtensor.pack(self.path("x.mmt"), [self.path("docs.mmt")], fields="tokens", separator=-1)

    def test_documents_from_a_token_array_and_its_offsets(self):
        # Tokenized documents as numpy keeps them: one token array, where each document starts.
        docs = [np.arange(n, dtype=np.uint16) + 100 * n for n in [3, 0, 5, 2, 7, 1]]
        np.save(self.path("tokens.npy"), np.concatenate(docs))
        np.save(self.path("offsets.npy"), np.cumsum([0] + [len(d) for d in docs]))
        np.save(self.path("n.npy"), np.array([len(d) for d in docs]))
        stats = mmtensor.pack(self.path("d.mmt"), {"tokens": self.path("tokens.npy"), "n": self.path("n.npy")},
                              offsets={"tokens": self.path("offsets.npy")}, codec="lz4")
        self.assertEqual(stats["records"], len(docs))
        ds = mmtensor.Dataset(self.path("d.mmt"))
        for d, sample in zip(docs, ds):
            np.testing.assert_array_equal(sample["tokens"], d)
            self.assertEqual(int(sample["n"]), len(d))
        # Images of several sizes: 1-D values, each record's shape.
        images = [np.full((h, w, 3), h * 10 + w, dtype=np.uint8) for h, w in [(2, 3), (4, 1), (1, 1)]]
        np.save(self.path("image.npy"), np.concatenate([i.ravel() for i in images]))
        np.save(self.path("image.offsets.npy"), np.cumsum([0] + [i.size for i in images]))
        np.save(self.path("image.shapes.npy"), np.array([i.shape for i in images]))
        mmtensor.pack(self.path("i.mmt"), {"image": self.path("image.npy")},
                      offsets={"image": self.path("image.offsets.npy")}, shapes={"image": self.path("image.shapes.npy")})
        for image, sample in zip(images, mmtensor.Dataset(self.path("i.mmt"))):
            np.testing.assert_array_equal(sample["image"], image)
        with self.assertRaisesRegex(ValueError, "the offsets of field 'tokens' .*: ends at 17, but the values hold 18"):
            np.save(self.path("short.npy"), np.cumsum([0] + [len(d) for d in docs])[:-1].tolist() + [17])
            mmtensor.pack(self.path("x.mmt"), {"tokens": self.path("tokens.npy")}, offsets={"tokens": self.path("short.npy")})
        with self.assertRaisesRegex(TypeError, "offsets= must be a dict"):
            mmtensor.pack(self.path("x.mmt"), {"tokens": self.path("tokens.npy")}, offsets=[self.path("offsets.npy")])
        with self.assertRaisesRegex(TypeError, "offsets= maps field names to paths of .npy files, not numpy.ndarray"):
            mmtensor.pack(self.path("x.mmt"), {"tokens": self.path("tokens.npy")}, offsets={"tokens": np.array([0, 1])})
        self.assertFalse(os.path.exists(self.path("x.mmt")))

    def write_megatron(self, prefix, documents, dtype=np.uint16):
        """PREFIX.bin and PREFIX.idx as Megatron-LM's IndexedDatasetBuilder writes them: each
        document a list of sequences (sentences), their tokens back to back in the .bin."""
        code = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7,
                np.uint16: 8}[dtype]
        lengths, document_indices = [], [0]
        with open(prefix + ".bin", "wb") as bin_file:
            for sequences in documents:
                for sequence in sequences:
                    bin_file.write(np.asarray(sequence, dtype=dtype).tobytes(order="C"))
                    lengths.append(len(sequence))
                document_indices.append(len(lengths))
        itemsize = np.dtype(dtype).itemsize
        pointers = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64) * itemsize)[:-1]]) if lengths else []
        with open(prefix + ".idx", "wb") as idx:
            idx.write(b"MMIDIDX\x00\x00")
            idx.write(struct.pack("<Q", 1))
            idx.write(struct.pack("<B", code))
            idx.write(struct.pack("<Q", len(lengths)))
            idx.write(struct.pack("<Q", len(document_indices)))
            idx.write(np.asarray(lengths, dtype=np.int32).tobytes(order="C"))
            idx.write(np.asarray(pointers, dtype=np.int64).tobytes(order="C"))
            idx.write(np.asarray(document_indices, dtype=np.int64).tobytes(order="C"))

    def test_megatron_indexed_datasets(self):
        rng = np.random.default_rng(3)
        documents = [[rng.integers(0, 50000, size=n) for n in rng.integers(1, 40, size=rng.integers(1, 4))]
                     for _ in range(200)]
        documents[7] = []  # a document of no sentences
        self.write_megatron(self.path("c_text_document"), documents)
        stats = mmtensor.pack(self.path("m.mmt"), {"ids": self.path("c_text_document")}, codec="zstd")
        self.assertEqual(stats["records"], 200)
        ds = mmtensor.Dataset(self.path("m.mmt"))
        self.assertEqual(ds.metadata["source"], "megatron")
        for d in [0, 7, 199]:
            expected = np.concatenate(documents[d]) if documents[d] else np.zeros(0)
            np.testing.assert_array_equal(ds[d]["ids"], expected.astype(np.uint16))
        # Windows of the stream, an end-of-text token after each document.
        mmtensor.pack(self.path("w.mmt"), [self.path("c_text_document.idx")], window=33, window_stride=32,
                      separator=0)
        stream = np.concatenate([np.append(np.concatenate(d) if d else [], 0) for d in documents]).astype(np.uint16)
        w = mmtensor.Dataset(self.path("w.mmt"))
        self.assertEqual(len(w), (len(stream) - 33) // 32 + 1)
        np.testing.assert_array_equal(w.get_batch(np.arange(len(w)), "tokens")[-1], stream[(len(w) - 1) * 32:][:33])
        with open(self.path("c_text_document.idx"), "r+b") as idx:
            idx.seek(17)
            idx.write(b"\x09")
        with self.assertRaisesRegex(mmtensor.FormatError, r"c_text_document.idx: dtype code 9 \(byte 17\)"):
            mmtensor.pack(self.path("x.mmt"), [self.path("c_text_document")])

    def write_mds(self, folder, columns, samples):
        """A MosaicML Streaming dataset as its MDSWriter writes one (one shard): columns sorted by
        name; each sample the uint32 sizes of its variable columns, then every column's bytes;
        the shard a uint32 count, uint32 absolute offsets, the config as JSON, the samples."""
        os.makedirs(folder, exist_ok=True)
        names = sorted(columns)
        encodings = [columns[n] for n in names]
        fixed = {"int": 8, "uint8": 1, "float32": 4, "float64": 8}
        sizes = [fixed.get(e) for e in encodings]
        for e, i in zip(encodings, range(len(sizes))):
            if e.startswith("ndarray:") and e.count(":") == 2:
                dtype, shape = e.split(":")[1:]
                sizes[i] = int(np.prod([int(d) for d in shape.split(",")])) * np.dtype(dtype).itemsize
        config = {"column_encodings": encodings, "column_names": names, "column_sizes": sizes, "compression": None,
                  "format": "mds", "hashes": [], "size_limit": 1 << 26, "version": 2}
        config_data = json.dumps(config, sort_keys=True).encode("utf-8")

        def encode(encoding, value):
            if encoding == "str":
                return value.encode("utf-8")
            if encoding == "int":
                return np.int64(value).tobytes()
            if encoding == "json":
                return json.dumps(value).encode("utf-8")
            if encoding.startswith("ndarray"):
                parts = encoding.split(":")
                head = b""
                if len(parts) == 1:
                    head += bytes([{"int32": 33, "uint16": 16, "float32": 34}[value.dtype.name]])
                if len(parts) <= 2:
                    head += bytes([(value.ndim << 2) | 0]) + np.array(value.shape, np.uint8).tobytes()
                return head + value.tobytes()
            return np.dtype(encoding).type(value).tobytes()

        encoded = []
        for sample in samples:
            data = [encode(e, sample[n]) for n, e in zip(names, encodings)]
            head = np.array([len(d) for d, size in zip(data, sizes) if size is None], np.uint32).tobytes()
            encoded.append(head + b"".join(data))
        offsets = np.array([0] + [len(e) for e in encoded]).cumsum().astype(np.uint32)
        offsets += 4 + len(offsets.tobytes()) + len(config_data)
        shard_data = np.uint32(len(samples)).tobytes() + offsets.tobytes() + config_data + b"".join(encoded)
        with open(os.path.join(folder, "shard.00000.mds"), "wb") as f:
            f.write(shard_data)
        shard = dict(config, samples=len(samples),
                     raw_data={"basename": "shard.00000.mds", "bytes": len(shard_data), "hashes": {}}, zip_data=None)
        with open(os.path.join(folder, "index.json"), "w") as f:
            json.dump({"shards": [shard], "version": 2}, f)

    def test_mosaicml_streaming_datasets(self):
        rng = np.random.default_rng(5)
        samples = [{"caption": f"picture {i}", "label": i % 7, "meta": {"i": i},
                    "image": rng.integers(0, 255, size=(4, 4, 3), dtype=np.uint8),
                    "tokens": rng.integers(0, 50000, size=rng.integers(1, 30), dtype=np.int32),
                    "mask": rng.integers(0, 2, size=(rng.integers(1, 9), rng.integers(1, 9)), dtype=np.uint8)}
                   for i in range(40)]
        self.write_mds(self.path("mds"), {"caption": "str", "label": "int", "meta": "json", "image": "ndarray:uint8:4,4,3",
                                          "tokens": "ndarray", "mask": "ndarray:uint8"}, samples)
        stats = mmtensor.pack(self.path("m.mmt"), [self.path("mds")])
        self.assertEqual(stats["records"], 40)
        ds = mmtensor.Dataset(self.path("m.mmt"))
        self.assertEqual(ds.metadata["source"], "mds")
        self.assertEqual(json.loads(ds.metadata["mds_encodings"])["meta"], "json")
        for i in [0, 17, 39]:
            s = ds[i]
            self.assertEqual(bytes(s["caption"]).decode(), samples[i]["caption"])
            self.assertEqual(s["label"].item(), samples[i]["label"])
            self.assertEqual(json.loads(bytes(s["meta"])), samples[i]["meta"])
            np.testing.assert_array_equal(s["image"], samples[i]["image"])
            np.testing.assert_array_equal(s["tokens"], samples[i]["tokens"])
            np.testing.assert_array_equal(s["mask"], samples[i]["mask"])  # 2-D, of its own shape
        shapes = {f.name: f.shape for f in ds.fields}
        self.assertEqual((shapes["mask"], shapes["tokens"]), ((-1, -1), (-1,)))  # mask rows unlike: both vary

    def test_arrow_files(self):
        # The fuzzer's seed, an Arrow IPC file that tests/arrow_test_util.h wrote as pyarrow
        # lays one out: a struct (Hugging Face's Image), nested lists, a nullable float...
        seed = os.path.join(os.path.dirname(__file__), "..", "..", "fuzz", "corpus", "arrow", "file")
        with open(seed, "rb") as f, open(self.path("data.arrow"), "wb") as out:
            out.write(f.read())
        stats = mmtensor.pack(self.path("a.mmt"), [self.path("data.arrow")], fields=["image.bytes", "grid", "score"])
        self.assertEqual(stats["records"], 2)
        ds = mmtensor.Dataset(self.path("a.mmt"))
        self.assertEqual(ds.metadata["source"], "arrow")
        self.assertEqual(json.loads(ds.metadata["arrow_types"])["grid"], "list<list<int16>>")
        self.assertEqual(bytes(ds[0]["image.bytes"]), b"ab")
        np.testing.assert_array_equal(ds[1]["grid"], np.array([[3, 4], [5, 6]], dtype=np.int16))
        self.assertTrue(np.isnan(ds[1]["score"].item()))
        with self.assertRaisesRegex(ValueError, "no column 'nope'"):
            mmtensor.pack(self.path("b.mmt"), [self.path("data.arrow")], fields=["nope"])
        # What Polars' DataFrame.write_ipc writes: strings as string_view, lists as large_list.
        polars = os.path.join(os.path.dirname(__file__), "..", "data", "arrow", "polars.arrow")
        with open(os.path.join(os.path.dirname(__file__), "..", "data", "arrow", "polars.expected.json")) as f:
            expected = json.load(f)["rows"]
        mmtensor.pack(self.path("pl.mmt"), [polars], fields=["text", "words", "label"])
        ds = mmtensor.Dataset(self.path("pl.mmt"))
        self.assertEqual(json.loads(ds.metadata["arrow_types"])["text"], "string_view")
        for i in [0, 1, 2, 44]:
            self.assertEqual(bytes(ds[i]["text"]).decode(), expected[i]["text"] or "")
            self.assertEqual(bytes(ds[i]["words"]).decode(), "".join(expected[i]["words"]))
            self.assertEqual(ds[i]["words.lengths"].tolist(), [len(w.encode()) for w in expected[i]["words"]])
            self.assertEqual(bytes(ds[i]["label"]).decode(), expected[i]["label"])

    def test_tfrecord_files(self):
        # TensorFlow's TFRecord framing and tf.train.Example's wire format, written here as
        # TensorFlow writes them (TensorFlow is not needed to read them).
        def varint(v):
            v &= (1 << 64) - 1
            out = b""
            while True:
                byte, v = v & 0x7F, v >> 7
                out += bytes([byte | (0x80 if v else 0)])
                if not v:
                    return out

        def field(number, payload):
            return varint(number << 3 | 2) + varint(len(payload)) + payload

        def example(features):
            entries = b""
            for key, (kind, values) in features.items():
                if kind == "bytes":
                    lst = field(1, b"".join(field(1, v) for v in values))
                elif kind == "float":
                    lst = field(2, field(1, struct.pack(f"<{len(values)}f", *values)))
                else:
                    lst = field(3, field(1, b"".join(varint(v) for v in values)))
                entries += field(1, field(1, key.encode()) + field(2, lst))
            return field(1, entries)

        def crc32c(data):
            crc = 0xFFFFFFFF
            for byte in data:
                crc ^= byte
                for _ in range(8):
                    crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
            return crc ^ 0xFFFFFFFF

        def masked(crc):
            return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

        records = [example({"image/encoded": ("bytes", [b"jpeg-%d" % i]), "image/class/label": ("int", [i - 1]),
                            "bbox": ("float", [0.5 * i, 1.0, 2.0, 3.0])}) for i in range(3)]
        with open(self.path("train.tfrecord"), "wb") as f:
            for r in records:
                length = struct.pack("<Q", len(r))
                f.write(length + struct.pack("<I", masked(crc32c(length))) + r + struct.pack("<I", masked(crc32c(r))))
        stats = mmtensor.pack(self.path("t.mmt"), [self.path("train.tfrecord")],
                              fields=["image/encoded", "image/class/label", "bbox"])
        self.assertEqual(stats["records"], 3)
        ds = mmtensor.Dataset(self.path("t.mmt"))
        self.assertEqual(ds.metadata["source"], "tfrecord")
        self.assertEqual(list(ds[0].keys()), ["image.encoded", "image.class.label", "bbox"])
        self.assertEqual(bytes(ds[2]["image.encoded"]), b"jpeg-2")
        self.assertEqual(ds[0]["image.class.label"].item(), -1)
        np.testing.assert_array_equal(ds[1]["bbox"], np.array([0.5, 1, 2, 3], dtype=np.float32))
        with self.assertRaisesRegex(ValueError, "no feature 'label'"):
            mmtensor.pack(self.path("b.mmt"), [self.path("train.tfrecord")], fields=["label"])
        # TFRecordOptions("ZLIB") writes the records as one zlib stream, under the same name.
        with open(self.path("train.tfrecord"), "rb") as f:
            plain = f.read()
        with open(self.path("zlib.tfrecord"), "wb") as f:
            f.write(zlib.compress(plain))
        self.assertEqual(mmtensor.pack(self.path("z.mmt"), [self.path("zlib.tfrecord")])["records"], 3)
        self.assertEqual(bytes(mmtensor.Dataset(self.path("z.mmt"))[2]["image.encoded"]), b"jpeg-2")
        # tf.train.SequenceExample records, laid out as YouTube-8M's frame-level files: a
        # context (field 1, an Example's features) and feature lists (field 2), one Feature a
        # frame: rgb as one 8-byte string a frame, audio as 2 floats a frame.
        def sequence_example(video, frames):
            lists = b""
            for key, steps in (("rgb", [field(1, field(1, bytes([video * 10 + t]) * 8)) for t in range(frames)]),
                               ("audio", [field(2, field(1, struct.pack("<2f", t, -t))) for t in range(frames)])):
                lists += field(1, field(1, key.encode()) + field(2, b"".join(field(1, step) for step in steps)))
            return example({"id": ("bytes", [b"vid%d" % video])}) + field(2, lists)

        with open(self.path("frames.tfrecord"), "wb") as f:
            for r in [sequence_example(video, frames) for video, frames in [(0, 3), (1, 0), (2, 5)]]:
                length = struct.pack("<Q", len(r))
                f.write(length + struct.pack("<I", masked(crc32c(length))) + r + struct.pack("<I", masked(crc32c(r))))
        self.assertEqual(mmtensor.pack(self.path("f.mmt"), [self.path("frames.tfrecord")])["records"], 3)
        ds = mmtensor.Dataset(self.path("f.mmt"))
        self.assertTrue(json.loads(ds.metadata["tfrecord_features"])["rgb"]["feature_list"])
        rgb = np.asarray(ds[2]["rgb"])
        self.assertEqual((rgb.shape, rgb.dtype), ((5, 8), np.uint8))
        np.testing.assert_array_equal(rgb[:, 0], [20, 21, 22, 23, 24])
        np.testing.assert_array_equal(ds[0]["audio"], np.array([[0, 0], [1, -1], [2, -2]], dtype=np.float32))
        self.assertEqual(np.asarray(ds[1]["audio"]).shape, (0, 2))  # a video of no frames
        self.assertEqual(bytes(ds[1]["id"]), b"vid1")
        # fields= chooses a feature list by kind where the context has a feature of its key.
        mmtensor.pack(self.path("a.mmt"), [self.path("frames.tfrecord")], fields=["feature_list:audio", "feature:id"])
        self.assertEqual([f.name for f in mmtensor.Dataset(self.path("a.mmt")).fields], ["audio", "id"])

    def test_parquet_files(self):
        # A Hugging Face image shard as arrow-rs writes it (tests/data/parquet), packed
        # straight from the file, its ClassLabel's names kept.
        shard = os.path.join(os.path.dirname(__file__), "..", "data", "parquet", "pw_hf_image.parquet")
        stats = mmtensor.pack(self.path("p.mmt"), [shard])
        self.assertEqual(stats["records"], 6)
        ds = mmtensor.Dataset(self.path("p.mmt"))
        self.assertEqual(ds.metadata["source"], "parquet")
        self.assertEqual(json.loads(ds.metadata["classes"]), ["cat", "dog"])
        self.assertEqual(bytes(ds[2]["image.bytes"])[:4], b"\x89PNG")
        self.assertEqual(bytes(ds[2]["image.path"]), b"train/dog_2.png")
        self.assertEqual(ds[3]["label"].item(), 1)
        # A chat dataset's messages, list<struct<role, content>>: a field of each column's
        # values a row, chosen by the struct's name.
        chat = os.path.join(os.path.dirname(__file__), "..", "data", "parquet", "duckdb_chat.parquet")
        mmtensor.pack(self.path("c.mmt"), [chat], fields=["messages"])
        ds = mmtensor.Dataset(self.path("c.mmt"))
        self.assertEqual(list(ds[1].keys()), ["messages.role", "messages.role.lengths", "messages.role.valid",
                                              "messages.content", "messages.content.lengths", "messages.content.valid"])
        lengths = ds[1]["messages.role.lengths"].tolist()
        roles = bytes(ds[1]["messages.role"]).decode()
        self.assertEqual([roles[:lengths[0]], roles[lengths[0]:]], ["user", "assistant"])
        # DuckDB's nullable int8 (zeros and a mask, i8.valid) and decimal(9, 2) (float64: NaN
        # and a mask, dec_9_2.valid).
        types = os.path.join(os.path.dirname(__file__), "..", "data", "parquet", "duckdb_types.parquet")
        mmtensor.pack(self.path("t.mmt"), [types], fields=["i8", "dec_9_2"])
        ds = mmtensor.Dataset(self.path("t.mmt"))
        self.assertEqual(list(ds[5].keys()), ["i8", "i8.valid", "dec_9_2", "dec_9_2.valid"])
        self.assertEqual((ds[5]["i8"].item(), ds[5]["i8.valid"].item()), (0, False))
        self.assertTrue(ds[4]["i8.valid"].item())
        self.assertEqual(ds[1]["dec_9_2"].item(), 1.23)
        self.assertEqual(json.loads(ds.metadata["arrow_types"])["dec_9_2"], "decimal128(9, 2)")

    @unittest.skipUnless(os.path.exists(FASHION), "no dataset-fashion-mnist")
    def test_idx_files(self):
        mmtensor.pack(self.path("f.mmt"), {"images": os.path.join(FASHION, "train-images-idx3-ubyte.gz"),
                                           "labels": os.path.join(FASHION, "train-labels-idx1-ubyte.gz")})
        ds = mmtensor.Dataset(self.path("f.mmt"))
        self.assertEqual(len(ds), 60000)
        self.assertEqual(ds[0]["images"].shape, (28, 28))

    def test_ctrl_c_cancels_and_leaves_nothing(self):
        # Slow to compress (zstd at its highest level), so the interrupt comes mid-pack.
        rng = np.random.default_rng(0)
        np.save(self.path("big.npy"), rng.integers(0, 16, size=(4096, 4096), dtype=np.uint8))
        with self.assertRaises(KeyboardInterrupt), sigint_after(0.3):
            mmtensor.pack(self.path("big.mmt"), {"x": self.path("big.npy")}, codec="zstd:19", threads=1)
        self.assertFalse(os.path.exists(self.path("big.mmt")))
        self.assertEqual(sorted(os.listdir(self.dir.name)), ["big.npy"])

    def test_ctrl_c_while_the_file_is_finished_leaves_nothing(self):
        # One record of 6 MiB: appended at once, then compressed (zstd at its highest level,
        # seconds here) inside finish(). The interrupt used to be taken by the last progress
        # report and dropped (pack() returned as if none had come), then raised once the
        # dataset was published; finish() now asks while it compresses and before the rename.
        rng = np.random.default_rng(0)
        np.save(self.path("one.npy"), rng.integers(0, 16, size=(1, 6 << 20), dtype=np.uint8))
        with self.assertRaises(KeyboardInterrupt), sigint_after(0.3):
            mmtensor.pack(self.path("one.mmt"), {"x": self.path("one.npy")}, codec="zstd:19",
                          chunk_bytes=8 << 20, threads=1)
        self.assertEqual(sorted(os.listdir(self.dir.name)), ["one.npy"])
    def test_ctrl_c_while_the_inputs_are_read_cancels(self):
        # 1 GiB of IDX values in gzip members of 64 MiB: decoded before the first record is
        # packed. The loaders ask between steps of 16 MiB (the interrupt used to wait for the
        # whole decode, then the first progress report).
        member = gzip.compress(bytes(64 << 20), compresslevel=1)
        with open(self.path("big-idx3-ubyte.gz"), "wb") as f:
            f.write(gzip.compress(bytes([0, 0, 8, 3, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0])))
            for _ in range(16):
                f.write(member)
        with self.assertRaises(KeyboardInterrupt), sigint_after(0.05):
            mmtensor.pack(self.path("big.mmt"), {"x": self.path("big-idx3-ubyte.gz")})
        self.assertEqual(sorted(os.listdir(self.dir.name)), ["big-idx3-ubyte.gz"])


if __name__ == "__main__":
    unittest.main()
