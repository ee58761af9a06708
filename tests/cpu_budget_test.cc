// How many CPUs the engine sizes its threads by: the affinity mask and cgroup CPU quotas.
#include "cpu_budget.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "test_util.h"

namespace mmt::detail {
namespace {

namespace fs = std::filesystem;
using mmt::testing::TempDir;

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST(CpuBudget, CgroupQuotaTextsAsCpus) {
  EXPECT_EQ(parse_cpu_max("max 100000\n"), std::nullopt);
  EXPECT_EQ(parse_cpu_max("150000 100000\n"), 1.5);
  EXPECT_EQ(parse_cpu_max("200000 100000"), 2.0);
  for (const char* bad : {"", "100000", "0 100000", "-5 100000", "x 100000", "100000 0", "1 2 3"})
    EXPECT_EQ(parse_cpu_max(bad), std::nullopt) << bad;
  EXPECT_EQ(parse_cfs_quota("-1\n", "100000\n"), std::nullopt);  // v1's "no quota"
  EXPECT_EQ(parse_cfs_quota("250000\n", "100000\n"), 2.5);
  EXPECT_EQ(parse_cfs_quota("250000", "0"), std::nullopt);
}

// A Kubernetes container under cgroup v2: the pod's folder holds the limit, the container's
// says "max"; the pod's bounds the container.
TEST(CpuBudget, AParentCgroupsQuotaBoundsTheProcess) {
  TempDir root;
  const fs::path cgroup = root.path() / "sys/fs/cgroup";
  write_file(cgroup / "kubepods/pod1/cpu.max", "400000 100000\n");
  write_file(cgroup / "kubepods/pod1/ctr/cpu.max", "max 100000\n");
  write_file(cgroup / "cpu.max", "max 100000\n");
  const std::string mountinfo =
      "24 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
      "31 23 0:28 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/ctr\n", mountinfo, root.path().string()), 4.0);
  // The tighter of two quotas on the way up.
  write_file(cgroup / "kubepods/pod1/ctr/cpu.max", "150000 100000\n");
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/ctr\n", mountinfo, root.path().string()), 1.5);
  // No limit anywhere, or no files at all: none.
  EXPECT_EQ(cgroup_cpu_limit("0::/\n", mountinfo, root.path().string()), std::nullopt);
  EXPECT_EQ(cgroup_cpu_limit("0::/elsewhere\n", mountinfo, root.path().string()), std::nullopt);
}

// cgroup v1 (here beside an empty v2 hierarchy, as systemd's hybrid layout has it), a mount
// whose root is the container's own cgroup (a Docker container), and a mount point with a
// space in it (written \040 in mountinfo).
TEST(CpuBudget, CgroupV1QuotasThroughTheMountsRoot) {
  TempDir root;
  write_file(root.path() / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000\n");
  write_file(root.path() / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const std::string mountinfo =
      "31 23 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"
      "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
      "33 31 0:30 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
  const std::string proc_cgroup = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n";
  EXPECT_EQ(cgroup_cpu_limit(proc_cgroup, mountinfo, root.path().string()), 2.0);
  // A cgroup outside what the mount shows cannot be read: no limit rather than a stranger's.
  EXPECT_EQ(cgroup_cpu_limit("4:cpu,cpuacct:/other\n", mountinfo, root.path().string()), std::nullopt);
  EXPECT_EQ(cgroup_cpu_limit("4:cpu,cpuacct:/docker/abcdef\n", mountinfo, root.path().string()), std::nullopt);

  write_file(root.path() / "cg v1/cpu.cfs_quota_us", "50000\n");
  write_file(root.path() / "cg v1/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cgroup_cpu_limit("3:cpu:/\n", "32 31 0:29 / /cg\\040v1 rw - cgroup cgroup rw,cpu\n",
                             root.path().string()),
            0.5);
  // Of two mounts of one hierarchy, the one that shows the process's cgroup; a name that
  // merely starts with ".." is a name.
  write_file(root.path() / "b/..pod/cpu.cfs_quota_us", "300000\n");
  write_file(root.path() / "b/..pod/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cgroup_cpu_limit("4:cpu:/kube/..pod\n",
                             "32 31 0:29 /docker /a rw - cgroup cgroup rw,cpu\n"
                             "33 31 0:29 /kube /b rw - cgroup cgroup rw,cpu\n",
                             root.path().string()),
            3.0);
  EXPECT_EQ(cgroup_cpu_limit("4:cpu:/kube/../docker\n", "33 31 0:29 / /b rw - cgroup cgroup rw,cpu\n",
                             root.path().string()),
            std::nullopt);
  // Lines that are not what they should be are passed over.
  EXPECT_EQ(cgroup_cpu_limit("garbage\n3:cpu:relative\n\n", "nonsense\n - \n", root.path().string()), std::nullopt);
}

// A loader pinned to a subset of the machine (taskset, numactl, one rank of several) sizes
// its threads by that subset.
TEST(CpuBudget, TheAffinityMaskBoundsTheCount) {
  const int all = available_cpus();
  EXPECT_GE(all, 1);
  EXPECT_LE(all, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  int pinned_affinity = 0, pinned_available = 0;
  bool pinned = false;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(static_cast<int>(sched_getcpu() < 0 ? 0 : sched_getcpu()), &one);
    pinned = sched_setaffinity(0, sizeof one, &one) == 0;
    pinned_affinity = affinity_cpus().value_or(-1);
    pinned_available = available_cpus();
  }).join();
  if (!pinned) GTEST_SKIP() << "this system refuses to set the thread's affinity";
  EXPECT_EQ(pinned_affinity, 1);
  EXPECT_EQ(pinned_available, 1);
}

}  // namespace
}  // namespace mmt::detail
