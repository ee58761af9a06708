#include "mmtensor/mmtensor.h"

namespace mmt {
const char* version() { return MMT_VERSION_STRING; }
}  // namespace mmt
