// How many CPUs this process may keep busy: what sizes the shared thread pool, the writer's
// default compression threads and whether loader workers spin.
//
// std::thread::hardware_concurrency() counts the machine's online CPUs, but a data loader
// usually runs where it may use fewer: pinned to a subset (taskset, numactl, a cpuset cgroup,
// one of several ranks per node) or limited by a CPU quota (a container's --cpus, a Kubernetes
// CPU limit). A pool sized by the machine then runs more spinning threads than it has CPUs,
// and its workers are descheduled in the middle of the batches they help with.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace mmt::detail {

// The CPUs in the calling thread's affinity mask (taskset and numactl set it for the whole
// process), bounded by the tightest CPU quota of the process's cgroups (v1 or v2, along the
// path up to the mount's root) rounded down; at least 1.
// Reads /proc and /sys on every call (tens of microseconds): callers ask once per pool or
// writer, not per batch.
int available_cpus() noexcept;

// ---- the parts, for tests ----

// CPUs in the calling thread's affinity mask (however many CPUs the system has); nullopt when
// the system does not say.
std::optional<int> affinity_cpus() noexcept;

// A cgroup v2 `cpu.max` ("QUOTA PERIOD", or "max PERIOD" for none) as CPUs; nullopt for no
// limit or text that is not that.
std::optional<double> parse_cpu_max(std::string_view text) noexcept;
// A cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us pair as CPUs (quota -1: no limit).
std::optional<double> parse_cfs_quota(std::string_view quota, std::string_view period) noexcept;

// The tightest CPU limit of the cgroups named by `proc_self_cgroup` (the text of
// /proc/self/cgroup), found through the mounts of `mountinfo` (/proc/self/mountinfo) with
// `filesystem_root` put before every mount point ("" for the real one; a folder in tests).
// Every cgroup from the process's own up to its mount's root counts: a parent's quota bounds
// its children. nullopt when none limits it, or nothing could be read.
std::optional<double> cgroup_cpu_limit(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                       const std::string& filesystem_root = "") noexcept;

}  // namespace mmt::detail
