#pragma once
// The names an error message lists when a name was not found, shared so that every such
// message reads alike.

#include <algorithm>
#include <cstddef>
#include <string>

namespace mmt::detail {

// 'a', 'b', 'c' and 17 more: the first 32 of items' names (name_of(item) gives one), quoted;
// a file of thousands of fields would drown the message in them.
template <typename Items, typename NameOf>
std::string quoted_names(const Items& items, NameOf name_of) {
  constexpr size_t kListed = 32;
  std::string listed;
  size_t count = 0;
  for (const auto& item : items) {
    if (count++ >= kListed) continue;  // counted, not listed
    listed.append(listed.empty() ? "'" : ", '").append(name_of(item)).append("'");
  }
  if (count > kListed) listed.append(" and ").append(std::to_string(count - kListed)).append(" more");
  return listed;
}

}  // namespace mmt::detail
