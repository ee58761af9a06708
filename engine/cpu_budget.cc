#include "cpu_budget.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <thread>
#include <vector>

namespace mmt::detail {
namespace {

// A /proc or cgroup file's text (these are small); nullopt when it cannot be read.
std::optional<std::string> read_small_file(const std::string& path) {
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};  // closed on every way out, throws too
  if (file.fd < 0) return std::nullopt;
  std::string text;
  char buffer[4096];
  while (text.size() < (1 << 20)) {  // longer than any of these files: what was read
    const ssize_t n = ::read(file.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

std::optional<int64_t> parse_int(std::string_view s) {
  s = trim(s);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

std::vector<std::string_view> split(std::string_view s, char separator) {
  std::vector<std::string_view> parts;
  while (true) {
    const size_t at = s.find(separator);
    parts.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return parts;
    s.remove_prefix(at + 1);
  }
}

bool list_contains(std::string_view comma_list, std::string_view item) {
  for (std::string_view part : split(comma_list, ','))
    if (part == item) return true;
  return false;
}

// mountinfo writes a space, tab, newline or backslash in a path as \040, \011, \012, \134.
std::string unescape_mount_path(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' &&
        s[i + 2] >= '0' && s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct Mount {
  std::string root;        // the folder of the hierarchy mounted
  std::string mount_point;
};

// Whether cgroup `path` lies in the part of the hierarchy mounted from `root`.
bool path_is_under(std::string_view path, std::string_view root) {
  if (root == "/") return true;
  return path.starts_with(root) && (path.size() == root.size() || path[root.size()] == '/');
}

// The mount of cgroup v2 (`version2`) or of the v1 hierarchy that has the cpu controller,
// that shows cgroup `path` (a container may see several mounts of one hierarchy).
std::optional<Mount> find_cgroup_mount(std::string_view mountinfo, bool version2, std::string_view path) {
  for (std::string_view line : split(mountinfo, '\n')) {
    const size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    const std::vector<std::string_view> before = split(line.substr(0, dash), ' ');
    const std::vector<std::string_view> after = split(line.substr(dash + 3), ' ');
    if (before.size() < 5 || after.size() < 3) continue;
    const std::string_view type = after[0], super_options = after[2];
    const bool wanted = version2 ? type == "cgroup2" : type == "cgroup" && list_contains(super_options, "cpu");
    if (!wanted) continue;
    Mount mount{unescape_mount_path(before[3]), unescape_mount_path(before[4])};
    if (path_is_under(path, mount.root)) return mount;
  }
  return std::nullopt;
}

// The limit one cgroup folder sets, if any.
std::optional<double> folder_cpu_limit(const std::string& folder, bool version2) {
  if (version2) {
    const auto text = read_small_file(folder + "/cpu.max");
    return text ? parse_cpu_max(*text) : std::nullopt;
  }
  const auto quota = read_small_file(folder + "/cpu.cfs_quota_us");
  const auto period = read_small_file(folder + "/cpu.cfs_period_us");
  return quota && period ? parse_cfs_quota(*quota, *period) : std::nullopt;
}

std::optional<double> tighter(std::optional<double> a, std::optional<double> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

}  // namespace

std::optional<double> parse_cpu_max(std::string_view text) noexcept {
  text = trim(text);
  const size_t space = text.find(' ');
  if (space == std::string_view::npos || text.substr(0, space) == "max") return std::nullopt;
  const auto quota = parse_int(text.substr(0, space)), period = parse_int(text.substr(space + 1));
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::optional<double> parse_cfs_quota(std::string_view quota_text, std::string_view period_text) noexcept {
  const auto quota = parse_int(quota_text), period = parse_int(period_text);
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;  // -1: no quota
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::optional<double> cgroup_cpu_limit(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                       const std::string& filesystem_root) noexcept try {
  std::optional<double> limit;
  for (std::string_view line : split(proc_self_cgroup, '\n')) {
    // "hierarchy-id:controllers:path"; the path may itself hold colons.
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, first), controllers = line.substr(first + 1, second - first - 1);
    const std::string_view path = line.substr(second + 1);
    const bool version2 = id == "0" && controllers.empty();
    if (!version2 && !list_contains(controllers, "cpu")) continue;
    if (path.empty() || path.front() != '/') continue;
    bool climbs = false;  // a ".." component would lead out of the mount
    for (std::string_view part : split(path, '/')) climbs |= part == "..";
    if (climbs) continue;
    // The path counts from the hierarchy's root; the mount shows the part under mount->root.
    // No mount showing the process's cgroup: nothing to read, rather than a stranger's limit.
    const std::optional<Mount> mount = find_cgroup_mount(mountinfo, version2, path);
    if (!mount) continue;
    std::string_view relative = path;
    if (mount->root != "/") relative.remove_prefix(mount->root.size());
    const std::string top = filesystem_root + mount->mount_point;
    std::string folder = top + std::string(relative);
    while (!folder.empty() && folder.back() == '/' && folder.size() > top.size()) folder.pop_back();
    while (true) {
      limit = tighter(limit, folder_cpu_limit(folder, version2));
      if (folder.size() <= top.size()) break;
      folder.erase(folder.rfind('/'));
      if (folder.size() < top.size()) folder = top;
    }
  }
  return limit;
} catch (...) {  // out of memory while reading: no limit known
  return std::nullopt;
}

std::optional<int> affinity_cpus() noexcept {
  // The mask must be at least as large as the kernel's: grown until the call accepts it.
  for (int cpus = 1024; cpus <= (1 << 20); cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) return std::nullopt;
    const size_t bytes = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(bytes, set);
    const int rc = sched_getaffinity(0, bytes, set);
    const int count = rc == 0 ? CPU_COUNT_S(bytes, set) : 0;
    const int error = errno;
    CPU_FREE(set);
    if (rc == 0) return count > 0 ? std::optional<int>(count) : std::nullopt;
    if (error != EINVAL) return std::nullopt;
  }
  return std::nullopt;
}

int available_cpus() noexcept {
  int cpus = affinity_cpus().value_or(static_cast<int>(std::thread::hardware_concurrency()));
  try {
    const auto cgroup = read_small_file("/proc/self/cgroup");
    const auto mountinfo = read_small_file("/proc/self/mountinfo");
    if (cgroup && mountinfo)
      if (const auto limit = cgroup_cpu_limit(*cgroup, *mountinfo))
        // Rounded down (at least 1), as Rust's available_parallelism does: threads that spin
        // while they wait would use up a fractional quota and be throttled.
        cpus = std::min(cpus, static_cast<int>(std::clamp(std::floor(*limit), 1.0, 1e6)));
  } catch (...) {  // out of memory: the affinity alone
  }
  return std::max(cpus, 1);
}

}  // namespace mmt::detail
