#include <mmtensor/mmtensor.h>

#include <iostream>

int main() {
  mmt::Tensor x = mmt::arange(6).view({2, 3});
  std::cout << "mmtensor " << mmt::version() << ": " << x.t() << "\n";
  return x.t().is_contiguous() ? 1 : 0;
}
