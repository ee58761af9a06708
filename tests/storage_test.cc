// UntypedStorage: file mappings with PyTorch's from_file rules, host/pinned/CUDA memory,
// lifetime, and clear errors on bad arguments.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <vector>

#include "mmtensor/mmtensor.h"
#include "test_util.h"

namespace mmt {
namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

using testing::error_of;

TEST(Storage, EmptyStorage) {
  UntypedStorage s;
  EXPECT_EQ(s.nbytes(), 0);
  EXPECT_EQ(s.data(), nullptr);
  EXPECT_EQ(s.device(), kCPU);
  EXPECT_TRUE(s.filename().empty());
}

TEST(Storage, HostAllocationIsAligned) {
  for (size_t alignment : {64u, 256u, 4096u}) {
    UntypedStorage s = UntypedStorage::allocate(1000, kCPU, alignment);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % alignment, 0u);
    EXPECT_EQ(s.nbytes(), 1000);
    EXPECT_FALSE(s.is_pinned());
  }
  EXPECT_THROW(UntypedStorage::allocate(10, kCPU, 48), ValueError);
  EXPECT_THROW(UntypedStorage::allocate(-1), ValueError);
  // An alignment no allocator can give is named, not only the 10 bytes asked for. (The
  // sanitizers' allocators abort on such a request rather than fail it.)
  if (!testing::kAddressSanitizer && !testing::kThreadSanitizer) {
    const std::string message = error_of([] { UntypedStorage::allocate(10, kCPU, size_t{1} << 62); });
    EXPECT_NE(message.find("aligned to 4611686018427387904 bytes"), std::string::npos) << message;
  }
}

TEST(Storage, CloneCopyFill) {
  UntypedStorage a = UntypedStorage::allocate(8);
  a.fill_(3);
  UntypedStorage b = a.clone();
  EXPECT_FALSE(b.is_same(a));
  EXPECT_EQ(b.data()[7], std::byte{3});
  a.fill_(9);
  EXPECT_EQ(b.data()[0], std::byte{3});
  b.copy_(a);
  EXPECT_EQ(b.data()[0], std::byte{9});
  UntypedStorage wrong = UntypedStorage::allocate(4);
  EXPECT_NE(error_of([&] { b.copy_(wrong); }).find("sizes differ"), std::string::npos);
}

TEST(Storage, FromFileSharedCreatesAndGrows) {
  testing::TempDir dir;
  const std::string path = dir.file("grow.bin");
  {
    UntypedStorage s = UntypedStorage::from_file(path, true, 100);
    EXPECT_EQ(s.nbytes(), 100);
    s.mutable_data()[99] = std::byte{5};
  }
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 100);
  UntypedStorage again = UntypedStorage::from_file(path, true, 200);  // grows the file
  EXPECT_EQ(again.data()[99], std::byte{5});
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 200);
}

TEST(Storage, FromFilePrivateNeverWritesTheFile) {
  testing::TempDir dir;
  const std::string path = dir.file("private.bin");
  write_file(path, "abcdef");
  UntypedStorage s = UntypedStorage::from_file(path, false, 6);
  s.mutable_data()[0] = std::byte{'X'};
  UntypedStorage fresh = UntypedStorage::from_file(path, false, 6);
  EXPECT_EQ(fresh.data()[0], std::byte{'a'});
  EXPECT_EQ(s.data()[0], std::byte{'X'});
  // nbytes == 0 maps the whole file.
  EXPECT_EQ(UntypedStorage::from_file(path, false, 0).nbytes(), 6);
}

TEST(Storage, FromFileErrorsNameTheProblem) {
  testing::TempDir dir;
  const std::string missing = dir.file("missing.bin");
  std::string msg = error_of([&] { UntypedStorage::from_file(missing, false, 4); });
  EXPECT_NE(msg.find("missing.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;

  const std::string small = dir.file("small.bin");
  write_file(small, "abc");
  msg = error_of([&] { UntypedStorage::from_file(small, false, 10); });
  EXPECT_NE(msg.find("holds 3 bytes but nbytes=10"), std::string::npos) << msg;

  msg = error_of([&] { UntypedStorage::from_file(dir.path().string(), false, 4); });
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
  msg = error_of([&] { UntypedStorage::from_file(dir.path().string(), true, 4); });
  EXPECT_FALSE(msg.empty());

  msg = error_of([&] { UntypedStorage::from_file(small, false, -5); });
  EXPECT_NE(msg.find("nbytes must be non-negative"), std::string::npos) << msg;

  // A FIFO is refused by its kind: opened read-only, it would wait for a writer forever.
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const auto& open : std::vector<std::function<void()>>{
           [&] { UntypedStorage::map_file(fifo, MapMode::ReadOnly); },
           [&] { UntypedStorage::map_file(fifo, MapMode::Private); },
           [&] { UntypedStorage::map_file(fifo, MapMode::Shared); },
           [&] { UntypedStorage::from_file(fifo, false, 0); },
           [&] { UntypedStorage::from_file(fifo, true, 10); }}) {
    msg = error_of(open);
    EXPECT_NE(msg.find("'" + fifo + "' is not a regular file (a FIFO)"), std::string::npos) << msg;
  }
}

TEST(Storage, MapFileRangesAndReadOnly) {
  testing::TempDir dir;
  const std::string path = dir.file("range.bin");
  write_file(path, "0123456789");
  UntypedStorage s = UntypedStorage::map_file(path, MapMode::ReadOnly, 3, 4);
  EXPECT_EQ(s.nbytes(), 4);
  EXPECT_EQ(s.data()[0], std::byte{'3'});
  EXPECT_TRUE(s.is_read_only());
  EXPECT_EQ(s.filename(), path);
  std::string msg = error_of([&] { s.mutable_data(); });
  EXPECT_NE(msg.find("of '" + path + "' is read-only (mapped with MapMode::ReadOnly); clone() it"), std::string::npos)
      << msg;
  // Read-only memory without a file (a decoded chunk that the cache shares) is not said to
  // be a mapping.
  static std::byte shared[8];
  msg = error_of([&] { UntypedStorage::from_blob(shared, 8, [](void*) {}, kCPU, /*read_only=*/true).mutable_data(); });
  EXPECT_NE(msg.find("storage is read-only (memory the engine shares, such as a decoded chunk in the cache); clone()"),
            std::string::npos)
      << msg;
  // A tensor over a read-only mapping refuses writes with the same error, never a SIGSEGV.
  Tensor t(s, kUInt8, {4});
  EXPECT_THROW(t.fill_(1), ValueError);
  EXPECT_EQ(UntypedStorage::map_file(path).nbytes(), 10);
  EXPECT_EQ(UntypedStorage::map_file(path, MapMode::ReadOnly, 10).nbytes(), 0);
  EXPECT_THROW(UntypedStorage::map_file(path, MapMode::ReadOnly, 11), ValueError);
  EXPECT_THROW(UntypedStorage::map_file(path, MapMode::ReadOnly, 8, 3), ValueError);
  EXPECT_THROW(UntypedStorage::map_file(path, MapMode::ReadOnly, -1), ValueError);
  // Hints never change results.
  s.advise(AccessAdvice::Random);
  s.advise(AccessAdvice::WillNeed, 1, 2);
  s.advise(AccessAdvice::DontNeed);
  EXPECT_EQ(s.data()[3], std::byte{'6'});
}

TEST(Storage, MappingOutlivesEveryHandleButTheLastView) {
  testing::TempDir dir;
  const std::string path = dir.file("life.bin");
  write_file(path, std::string(4096, 'z'));
  Tensor view;
  {
    UntypedStorage s = UntypedStorage::map_file(path);
    view = Tensor(s, kUInt8, {4096}).slice(0, 100, 200);
  }
  EXPECT_EQ(view.at<uint8_t>({5}), 'z');  // still mapped
  EXPECT_EQ(view.untyped_storage().use_count(), 1);
}

TEST(Storage, FromBlobRunsDeleter) {
  bool freed = false;
  {
    static char buffer[16];
    UntypedStorage s = UntypedStorage::from_blob(buffer, 16, [&](void*) { freed = true; });
    UntypedStorage copy = s;
    EXPECT_TRUE(copy.is_same(s));
    EXPECT_EQ(s.filename(), "");
  }
  EXPECT_TRUE(freed);
  // Memory the caller mapped from a file itself can say which file.
  static char mapped[16];
  EXPECT_EQ(UntypedStorage::from_blob(mapped, 16, [](void*) {}, kCPU, true, "/data/x.bin").filename(), "/data/x.bin");
}

TEST(Storage, PinnedMemoryFallsBackWithoutAGpu) {
  UntypedStorage s = UntypedStorage::allocate_pinned(1 << 20);
  EXPECT_EQ(s.nbytes(), 1 << 20);
  EXPECT_EQ(s.is_pinned(), cuda_device_count() > 0);
  UntypedStorage host = UntypedStorage::allocate(64);
  UntypedStorage pinned = host.pin_memory();
  EXPECT_EQ(pinned.nbytes(), 64);
  Tensor t = arange(10).pin_memory();
  EXPECT_EQ(t.to_vector<int64_t>()[9], 9);
}

TEST(Storage, CudaStorageWithoutDeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  std::string msg = error_of([] { UntypedStorage::allocate(16, Device::parse("cuda:0")); });
  EXPECT_FALSE(msg.empty());
  EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
  // An empty one too: no tensor may claim a device that is not there.
  EXPECT_NE(error_of([] { UntypedStorage::allocate(0, Device::parse("cuda:0")); }).find("cuda:0 is not available"),
            std::string::npos);
}

TEST(Storage, EmptyStorageOnAMissingDeviceIsRefused) {
  const std::string missing = "cuda:" + std::to_string(cuda_device_count());  // one past the last
  const std::string msg = error_of([&] { UntypedStorage::allocate(0, Device::parse(missing)); });
  EXPECT_NE(msg.find(missing + " is not available"), std::string::npos) << msg;
}

TEST(Storage, CudaRoundTrip) {
  MMT_SKIP_WITHOUT_CUDA();
  Device gpu = Device::parse("cuda:0");
  Tensor host = arange(1000, kFloat32).view({10, 100});
  Tensor dev = host.to(gpu);
  EXPECT_TRUE(dev.is_cuda());
  EXPECT_EQ(dev.device(), gpu);
  EXPECT_TRUE(dev.cpu().equal(host));
  Tensor dev_t = dev.t().contiguous();  // strided copy on a device tensor
  EXPECT_TRUE(dev_t.cpu().equal(host.t()));
  UntypedStorage s = UntypedStorage::allocate(256, gpu);
  s.fill_(7);
  UntypedStorage back = UntypedStorage::allocate(256);
  back.copy_(s);
  EXPECT_EQ(back.data()[255], std::byte{7});
  EXPECT_TRUE(UntypedStorage::allocate_pinned(16).is_pinned());
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), kCPU);
  EXPECT_EQ(Device::parse("cuda").str(), "cuda:0");
  EXPECT_EQ(Device::parse("cuda:3").index, 3);
  EXPECT_THROW(Device::parse("cuda:x"), ValueError);
  EXPECT_THROW(Device::parse("tpu"), ValueError);
  EXPECT_THROW(Device::parse("cuda:-1"), ValueError);
}

}  // namespace
}  // namespace mmt
