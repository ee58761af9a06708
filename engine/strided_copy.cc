#include "strided_copy.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace mmt::detail {
namespace {

struct Dim {
  int64_t size;
  int64_t dst_stride;  // bytes
  int64_t src_stride;  // bytes
};

// Fixed-size element moves let the compiler emit one load/store per element.
template <int64_t N>
struct Element {
  unsigned char bytes[N];
};

template <typename E>
void copy_run(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    E value;
    std::memcpy(&value, src + i * src_stride, sizeof(E));
    std::memcpy(dst + i * dst_stride, &value, sizeof(E));
  }
}

void copy_run_any(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t n,
                  int64_t element_bytes) {
  switch (element_bytes) {
    case 1: return copy_run<Element<1>>(dst, dst_stride, src, src_stride, n);
    case 2: return copy_run<Element<2>>(dst, dst_stride, src, src_stride, n);
    case 4: return copy_run<Element<4>>(dst, dst_stride, src, src_stride, n);
    case 8: return copy_run<Element<8>>(dst, dst_stride, src, src_stride, n);
    case 16: return copy_run<Element<16>>(dst, dst_stride, src, src_stride, n);  // complex128
    default:
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(dst + i * dst_stride, src + i * src_stride, static_cast<size_t>(element_bytes));
  }
}

// A 2-d transpose: `a` is dense in the destination, `b` is dense in the source. The copy goes
// tile by tile through a small buffer, one cache line wide on each side, so that each source
// line is read once in full and each destination line is written once in full. Without the
// buffer, rows a power-of-two stride apart (a 4096-wide matrix, an image plane) map to the
// same cache set and evict each other on every element.
template <typename E>
void copy_transpose(char* dst, const char* src, const Dim& a, const Dim& b) {
  constexpr int64_t kTileA = 64 / sizeof(E) < 8 ? 8 : 64 / sizeof(E);
  constexpr int64_t kTileB = 4 * kTileA;  // several lines per source row: fewer, longer reads
  E tile[kTileA][kTileB];  // tile[i][j]: row i of `a`, column j of `b`
  for (int64_t a0 = 0; a0 < a.size; a0 += kTileA) {
    const int64_t na = std::min(kTileA, a.size - a0);
    for (int64_t b0 = 0; b0 < b.size; b0 += kTileB) {
      const int64_t nb = std::min(kTileB, b.size - b0);
      for (int64_t i = 0; i < na; ++i) {  // read: a contiguous run of `b` per row of `a`
        const char* s = src + (a0 + i) * a.src_stride + b0 * b.src_stride;
        for (int64_t j = 0; j < nb; ++j) std::memcpy(&tile[i][j], s + j * sizeof(E), sizeof(E));
      }
      for (int64_t j = 0; j < nb; ++j) {  // write: a contiguous run of `a` per column of `b`
        char* d = dst + (b0 + j) * b.dst_stride + a0 * a.dst_stride;
        for (int64_t i = 0; i < na; ++i) std::memcpy(d + i * sizeof(E), &tile[i][j], sizeof(E));
      }
    }
  }
}

// The transpose of a few planes into a dense destination: channels-first images (or any
// [K, P] block with K <= 4) into channels-last. Element by element through the tile would
// move one byte at a time; with K fixed at compile time the loop over P vectorizes into
// loads from each plane and interleaving shuffles.
template <typename E, int K>
inline void interleave_planes_body(char* dst, const char* src, int64_t plane_stride, int64_t n) {
  const char* plane[K];
  for (int c = 0; c < K; ++c) plane[c] = src + c * plane_stride;
  E* out = reinterpret_cast<E*>(dst);  // E is a byte array type: any alignment is fine
  for (int64_t p = 0; p < n; ++p)
    for (int c = 0; c < K; ++c) std::memcpy(&out[p * K + c], plane[c] + p * sizeof(E), sizeof(E));
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// The same loop compiled for AVX2 (its byte shuffles make the 3-plane interleave 3x faster),
// chosen at run time. Not an ifunc/target_clones: resolvers run before sanitizer runtimes
// start, and crash instrumented builds.
template <typename E, int K>
__attribute__((target("avx2"))) void interleave_planes_avx2(char* dst, const char* src, int64_t plane_stride,
                                                             int64_t n) {
  interleave_planes_body<E, K>(dst, src, plane_stride, n);
}

// Asked each time (a load and a test of what libgcc found at startup), not kept in a
// function-local static, whose guard a fork could leave taken (fork_safety.h).
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2"); }

#define MMT_INTERLEAVE_AVX2 1
#endif

template <typename E, int K>
void interleave_planes(char* dst, const char* src, int64_t plane_stride, int64_t n) {
#ifdef MMT_INTERLEAVE_AVX2
  if (cpu_has_avx2()) return interleave_planes_avx2<E, K>(dst, src, plane_stride, n);
#endif
  interleave_planes_body<E, K>(dst, src, plane_stride, n);
}

template <typename E>
bool try_interleave_planes(char* dst, const char* src, const Dim& a, const Dim& b) {
  switch (a.size) {
    case 2: interleave_planes<E, 2>(dst, src, a.src_stride, b.size); return true;
    case 3: interleave_planes<E, 3>(dst, src, a.src_stride, b.size); return true;
    case 4: interleave_planes<E, 4>(dst, src, a.src_stride, b.size); return true;
    default: return false;
  }
}

void copy_transpose_any(char* dst, const char* src, const Dim& a, const Dim& b,
                        int64_t element_bytes) {
  // Destination dense over [b, a] with few `a`: interleave whole planes.
  if (b.dst_stride == a.size * element_bytes && a.size <= 4) {
    switch (element_bytes) {
      case 1: if (try_interleave_planes<Element<1>>(dst, src, a, b)) return; break;
      case 2: if (try_interleave_planes<Element<2>>(dst, src, a, b)) return; break;
      case 4: if (try_interleave_planes<Element<4>>(dst, src, a, b)) return; break;
      default: break;
    }
  }
  switch (element_bytes) {
    case 1: return copy_transpose<Element<1>>(dst, src, a, b);
    case 2: return copy_transpose<Element<2>>(dst, src, a, b);
    case 4: return copy_transpose<Element<4>>(dst, src, a, b);
    case 8: return copy_transpose<Element<8>>(dst, src, a, b);
    case 16: return copy_transpose<Element<16>>(dst, src, a, b);
    default:
      for (int64_t j = 0; j < b.size; ++j)
        copy_run_any(dst + j * b.dst_stride, a.dst_stride, src + j * b.src_stride, a.src_stride,
                     a.size, element_bytes);
  }
}

// Calls body(dst, src) once for each index of `outer` (the dimensions not handled inside).
template <typename Body>
void for_each_outer(char* dst, const char* src, const Dim* outer, size_t n, Body&& body) {
  if (n == 0) {
    body(dst, src);
    return;
  }
  DimVector counter(n, 0);
  while (true) {
    body(dst, src);
    size_t d = n;
    while (true) {
      if (d == 0) return;
      --d;
      dst += outer[d].dst_stride;
      src += outer[d].src_stride;
      if (++counter[d] < outer[d].size) break;
      dst -= outer[d].dst_stride * outer[d].size;
      src -= outer[d].src_stride * outer[d].size;
      counter[d] = 0;
    }
  }
}

}  // namespace

void copy_strided(void* dst_ptr, IntArrayRef dst_strides, const void* src_ptr,
                  IntArrayRef src_strides, IntArrayRef sizes, int64_t element_bytes) {
  const int64_t eb = element_bytes;
  Dim dims[64];
  Dim* heap_dims = nullptr;
  std::unique_ptr<Dim[]> heap;
  if (sizes.size() > 64) {
    heap.reset(new Dim[sizes.size()]);
    heap_dims = heap.get();
  }
  Dim* d = heap_dims ? heap_dims : dims;
  size_t n = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return;
    if (sizes[i] == 1) continue;  // contributes nothing to addressing
    d[n++] = Dim{sizes[i], dst_strides[i] * eb, src_strides[i] * eb};
  }
  char* dst = static_cast<char*>(dst_ptr);
  const char* src = static_cast<const char*>(src_ptr);
  if (n == 0) {
    std::memcpy(dst, src, static_cast<size_t>(eb));
    return;
  }
  // Outermost first by destination stride, so the innermost loop writes densely.
  auto magnitude = [](int64_t s) { return s < 0 ? -s : s; };
  std::stable_sort(d, d + n, [&](const Dim& x, const Dim& y) {
    if (magnitude(x.dst_stride) != magnitude(y.dst_stride))
      return magnitude(x.dst_stride) > magnitude(y.dst_stride);
    return magnitude(x.src_stride) > magnitude(y.src_stride);
  });
  // Merge a dimension into the one inside it when both sides step over it contiguously,
  // so [N, C, H, W] -> contiguous becomes one run. Built innermost-first in `merged`.
  std::unique_ptr<Dim[]> merged_heap;
  Dim merged_inline[64];
  Dim* merged = n > 64 ? (merged_heap.reset(new Dim[n]), merged_heap.get()) : merged_inline;
  size_t m = 0;
  merged[m++] = d[n - 1];
  for (size_t i = n - 1; i-- > 0;) {
    Dim& inner = merged[m - 1];
    const Dim& outer = d[i];
    if (outer.dst_stride == inner.dst_stride * inner.size &&
        outer.src_stride == inner.src_stride * inner.size)
      inner.size *= outer.size;
    else
      merged[m++] = outer;
  }
  for (size_t i = 0; i < m; ++i) d[i] = merged[m - 1 - i];  // back to outermost-first
  n = m;
  const size_t out = n - 1;
  const Dim inner = d[out];

  // Dense innermost run on both sides: memcpy whole runs.
  if (inner.dst_stride == eb && inner.src_stride == eb) {
    const size_t run = static_cast<size_t>(inner.size * eb);
    for_each_outer(dst, src, d, n - 1, [run](char* o, const char* i) { std::memcpy(o, i, run); });
    return;
  }
  // A transpose: destination dense in `inner`, source dense in another dimension.
  if (inner.dst_stride == eb && n >= 2) {
    for (size_t k = 0; k + 1 < n; ++k) {
      if (d[k].src_stride != eb) continue;
      const Dim b = d[k];
      Dim rest[64];
      std::unique_ptr<Dim[]> rest_heap;
      Dim* r = n > 64 ? (rest_heap.reset(new Dim[n]), rest_heap.get()) : rest;
      size_t m = 0;
      for (size_t i = 0; i + 1 < n; ++i)
        if (i != k) r[m++] = d[i];
      for_each_outer(dst, src, r, m, [&](char* o, const char* i) {
        copy_transpose_any(o, i, inner, b, eb);
      });
      return;
    }
  }
  for_each_outer(dst, src, d, n - 1, [&](char* o, const char* i) {
    copy_run_any(o, inner.dst_stride, i, inner.src_stride, inner.size, eb);
  });
}

}  // namespace mmt::detail
