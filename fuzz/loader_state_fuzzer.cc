// Fuzzes LoaderState::parse, which reads checkpoints a user may have edited or truncated:
// any text must give a state that round-trips, or a ValueError; never a crash or another
// exception type.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "mmtensor/error.h"
#include "mmtensor/loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const mmt::LoaderState state = mmt::LoaderState::parse(text);
    if (!(mmt::LoaderState::parse(state.to_string()) == state)) std::abort();
  } catch (const mmt::ValueError&) {
  }
  return 0;
}
