#include "hdf5_input.h"

#include <hdf5.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <utility>

#include "decode_limit.h"
#include "hdf5_chunks.h"
#include "import_util.h"
#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "scratch_file.h"
#include "utf8.h"

namespace mmt::detail {
namespace {

namespace fs = std::filesystem;

constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

// An HDF5 identifier, closed on every path out.
class Hid {
 public:
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Hid() {
    if (id_ >= 0) close_(id_);
  }
  Hid(Hid&& other) noexcept : id_(std::exchange(other.id_, -1)), close_(other.close_) {}
  Hid& operator=(Hid&& other) noexcept {
    if (this != &other) {
      if (id_ >= 0) close_(id_);
      id_ = std::exchange(other.id_, -1);
      close_ = other.close_;
    }
    return *this;
  }
  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its error stack to stderr by default; while a load runs, failures come back as
// return values instead, and this file words them. The calling thread's setting is restored.
class QuietErrors {
 public:
  QuietErrors() {
    // libhdf5's exit handler prints "infinite loop closing library" after a damaged file left
    // objects it cannot close; the process's end closes the files anyway.
    static std::once_flag once;
    std::call_once(once, [] { H5dont_atexit(); });
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace

std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* error, void* out) -> herr_t {
        if (n != 0) return 0;
        std::string& text = *static_cast<std::string*>(out);
        text = error->desc ? error->desc : "";
        char minor[256] = {};
        if (H5Eget_msg(error->min_num, nullptr, minor, sizeof minor) > 0 && minor[0] != '\0')
          text += str(text.empty() ? "" : " (", minor, text.empty() ? "" : ")");
        return 0;
      },
      &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? std::string("the HDF5 library gave no reason") : reason;
}

namespace {

std::string name_of(char* owned) {  // a name the library allocated, freed here
  std::string name = owned ? owned : "";
  H5free_memory(owned);
  return name;
}

// A float of the usual IEEE layout for its size: float16, bfloat16, float32, float64.
std::optional<ScalarType> float_dtype_of(hid_t type) {
  size_t sign_at = 0, exponent_at = 0, exponent_bits = 0, mantissa_at = 0, mantissa_bits = 0;
  if (H5Tget_fields(type, &sign_at, &exponent_at, &exponent_bits, &mantissa_at, &mantissa_bits) < 0) return std::nullopt;
  const size_t size = H5Tget_size(type);
  if (H5Tget_offset(type) != 0 || H5Tget_precision(type) != 8 * size || sign_at != 8 * size - 1 || mantissa_at != 0 ||
      exponent_at != mantissa_bits || exponent_bits + mantissa_bits + 1 != 8 * size)
    return std::nullopt;
  if (size == 2 && exponent_bits == 5) return kFloat16;
  if (size == 2 && exponent_bits == 8) return kBFloat16;
  if (size == 4 && exponent_bits == 8) return kFloat32;
  if (size == 8 && exponent_bits == 11) return kFloat64;
  return std::nullopt;
}

std::optional<ScalarType> integer_dtype_of(hid_t type) {
  const size_t size = H5Tget_size(type);
  if (H5Tget_offset(type) != 0 || H5Tget_precision(type) != 8 * size) return std::nullopt;
  const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
  switch (size) {
    case 1: return is_signed ? kInt8 : kUInt8;
    case 2: return is_signed ? kInt16 : kUInt16;
    case 4: return is_signed ? kInt32 : kUInt32;
    case 8: return is_signed ? kInt64 : kUInt64;
    default: return std::nullopt;
  }
}

// The little-endian IEEE type of a float dtype: float16 and bfloat16 made as h5py (numpy) and
// torch lay them out.
hid_t ieee_float_type(ScalarType dtype) {
  if (dtype == kFloat64) return H5Tcopy(H5T_IEEE_F64LE);
  const hid_t type = H5Tcopy(H5T_IEEE_F32LE);
  if (dtype == kFloat16 || dtype == kBFloat16) {
    const size_t mantissa = dtype == kFloat16 ? 10 : 7, exponent = dtype == kFloat16 ? 5 : 8;
    H5Tset_fields(type, 15, mantissa, exponent, 0, mantissa);
    H5Tset_precision(type, 16);
    H5Tset_size(type, 2);
    H5Tset_ebias(type, dtype == kFloat16 ? 15 : 127);
  }
  return type;
}

const char* class_name_of(H5T_class_t type_class) {
  switch (type_class) {
    case H5T_INTEGER: return "integers";
    case H5T_FLOAT: return "floats";
    case H5T_TIME: return "times";
    case H5T_STRING: return "strings";
    case H5T_BITFIELD: return "bitfields";
    case H5T_OPAQUE: return "opaque values (numpy's void type)";
    case H5T_COMPOUND: return "compound values (numpy's structured arrays)";
    case H5T_REFERENCE: return "references";
    case H5T_ENUM: return "enums";
    case H5T_VLEN: return "variable-length sequences";
    case H5T_ARRAY: return "array values";
    default: return "values of an unknown class";
  }
}

// What a dataset of `file_type` packs as, and the type it is read into memory as (the same
// layout, little-endian: what the field holds). Throws ValueError naming what it holds when
// it is not numbers or bools.
struct ValueType {
  ScalarType dtype;
  hid_t memory_type;  // owned by the caller's Hid
};
ValueType value_type_of(hid_t file_type, const std::string& what) {
  const H5T_class_t type_class = H5Tget_class(file_type);
  const size_t size = H5Tget_size(file_type);
  const auto refuse = [&](const std::string& why) {
    return ValueError(str(what, ": holds ", why, "; mmtensor packs HDF5 datasets of integers, floats, bools (h5py's "
                                                 "enum of FALSE and TRUE) and complex numbers (h5py's compound of r "
                                                 "and i)"));
  };
  const auto little_endian_copy = [&] {
    const hid_t copy = H5Tcopy(file_type);
    if (size > 1) H5Tset_order(copy, H5T_ORDER_LE);
    return copy;
  };
  switch (type_class) {
    case H5T_INTEGER:
      if (const auto dtype = integer_dtype_of(file_type)) return {*dtype, little_endian_copy()};
      throw refuse(str(H5Tget_precision(file_type), "-bit integers in ", size, " bytes"));
    case H5T_FLOAT:
      // Read as IEEE's own layout, whatever the file's bias, normalization or byte order (VAX):
      // the library converts; a copy of the file's type would keep its bits as they are.
      if (const auto dtype = float_dtype_of(file_type)) return {*dtype, ieee_float_type(*dtype)};
      throw refuse(str("floats of a layout other than IEEE float16, bfloat16, float32 or float64 (", size, " bytes)"));
    case H5T_ENUM: {
      // h5py writes numpy's bool so; another enum of one byte is its integer values.
      const Hid base(H5Tget_super(file_type), H5Tclose);
      const auto base_dtype = base ? integer_dtype_of(base.get()) : std::nullopt;
      if (!base_dtype || size != 1) throw refuse(str("enums of ", size, " bytes (an enum of one byte packs as integers)"));
      bool is_bool = H5Tget_nmembers(file_type) == 2;
      for (unsigned m = 0; is_bool && m < 2; ++m) {
        const std::string member = name_of(H5Tget_member_name(file_type, m));
        int8_t value = -1;
        is_bool = H5Tget_member_value(file_type, m, &value) >= 0 && value == static_cast<int8_t>(m) &&
                  member == (m == 0 ? "FALSE" : "TRUE");
      }
      return {is_bool ? kBool : *base_dtype, H5Tcopy(file_type)};
    }
    case H5T_COMPOUND: {
      bool is_complex = H5Tget_nmembers(file_type) == 2;
      std::optional<ScalarType> part;
      for (unsigned m = 0; is_complex && m < 2; ++m) {
        const Hid member(H5Tget_member_type(file_type, m), H5Tclose);
        const std::optional<ScalarType> dtype =
            member && H5Tget_class(member.get()) == H5T_FLOAT ? float_dtype_of(member.get()) : std::nullopt;
        is_complex = dtype && (*dtype == kFloat32 || *dtype == kFloat64) && (!part || *part == *dtype) &&
                     name_of(H5Tget_member_name(file_type, m)) == (m == 0 ? "r" : "i");
        part = dtype;
      }
      if (!is_complex) throw refuse(class_name_of(type_class));
      const size_t part_size = element_size(*part);
      const hid_t memory = H5Tcreate(H5T_COMPOUND, 2 * part_size);
      const hid_t native = *part == kFloat32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
      H5Tinsert(memory, "r", 0, native);
      H5Tinsert(memory, "i", part_size, native);
      return {*part == kFloat32 ? kComplex64 : kComplex128, memory};
    }
    default:
      throw refuse(class_name_of(type_class));
  }
}

// What the root reaches by hard links, by path (no leading '/'), in name order: datasets, and
// objects that are neither datasets nor groups (committed datatypes, which a damaged dataset's
// header can also read as). FormatError naming the object when one cannot be read (a damaged
// object header): a dataset left out without a word would be records lost.
struct Objects {
  std::vector<std::string> datasets, others;
};
Objects objects_of(hid_t file, const std::string& path) {
  struct Walk {
    Objects found;
    std::string unreadable;  // the first object that could not be opened
  } walk;
  const herr_t walked = H5Lvisit(
      file, H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t group, const char* name, const H5L_info_t* info, void* data) -> herr_t {
        if (info->type != H5L_TYPE_HARD) return 0;  // soft and external links may point anywhere
        Walk& w = *static_cast<Walk*>(data);
        const Hid object(H5Oopen(group, name, H5P_DEFAULT), H5Oclose);
        if (!object) {
          w.unreadable = name;
          return -1;
        }
        const H5I_type_t type = H5Iget_type(object.get());
        if (type == H5I_DATASET) w.found.datasets.push_back(name);
        else if (type != H5I_GROUP) w.found.others.push_back(name);
        return 0;
      },
      &walk);
  if (walked < 0) {
    const std::string reason = hdf5_reason();
    throw FormatError(walk.unreadable.empty()
                          ? str(path, ": its groups cannot be walked: ", reason)
                          : str(path, ": the object '", escaped(walk.unreadable), "' cannot be read (damaged?): ", reason));
  }
  H5Eclear2(H5E_DEFAULT);
  return walk.found;
}

std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < 20; ++i) text += str(i ? ", " : "", escaped(names[i]));
  if (names.size() > 20) text += str(", and ", names.size() - 20, " more");
  return text.empty() ? std::string("none") : text;
}

// The filters the dataset was written with that this libhdf5 cannot undo (h5py's lzf, the
// blosc and bitshuffle plugins), refused before any value is read.
void refuse_unavailable_filters(hid_t create_plist, const std::string& what) {
  const int filters = H5Pget_nfilters(create_plist);
  for (int f = 0; f < filters; ++f) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    char name[128] = {};
    const H5Z_filter_t id = H5Pget_filter2(create_plist, static_cast<unsigned>(f), &flags, &values, nullptr, sizeof name,
                                           name, &config);
    MMT_CHECK(id >= 0 && H5Zfilter_avail(id) > 0, ValueError, what, ": compressed with HDF5 filter ", id,
              name[0] ? str(" (", escaped(name), ")") : std::string(), ", which this HDF5 library does not have ",
              "(h5py's lzf and the blosc and bitshuffle plugins are not in libhdf5); rewrite it uncompressed or with ",
              "gzip first: h5repack -f NONE IN.h5 OUT.h5, or h5py's compression='gzip'");
  }
  H5Eclear2(H5E_DEFAULT);
}

}  // namespace

class Hdf5File : public std::enable_shared_from_this<Hdf5File> {
 public:
  explicit Hdf5File(std::string path)
      : path_(std::move(path)), file_bytes_(regular_file_size(path_)), file_(open(path_), H5Fclose) {}

  hid_t id() const { return file_.get(); }

  // The dataset's name, dtype and shape, and its values when they can be viewed in place.
  Hdf5Array describe(const std::string& name) {
    Hdf5Array out;
    out.name = name.starts_with('/') ? name.substr(1) : name;
    out.what = str(path_, ":/", escaped(out.name));
    const Opened dataset = open_dataset(out.name, out.what);
    out.dtype = dataset.dtype;
    out.sizes = dataset.sizes;
    out.file = shared_from_this();
    if (dataset.nbytes == 0) {
      out.values = empty(IntArrayRef(out.sizes), out.dtype);
    } else {
      out.values = view_in_place(dataset, out.what);
      if (out.values.defined()) check_bools(out.values, out.what);
    }
    return out;
  }

  Tensor read(const Hdf5Array& array) {
    Opened dataset = open_dataset(array.name, array.what);
    Tensor values = read_into_scratch(dataset, array.what);
    check_bools(values, array.what);
    return values;
  }

 private:
  struct Opened {
    Hid dataset{-1, H5Dclose}, file_type{-1, H5Tclose}, memory_type{-1, H5Tclose}, create_plist{-1, H5Pclose};
    ScalarType dtype = kUInt8;
    std::vector<int64_t> sizes;
    std::vector<hsize_t> dims;
    int64_t nbytes = 0;
  };

  static hid_t open(const std::string& path) {
    const Hid access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
    // Read-only: a filesystem without locks (some network ones) is no reason to refuse.
    if (access) H5Pset_file_locking(access.get(), true, /*ignore_when_disabled=*/true);
#endif
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, access ? access.get() : H5P_DEFAULT);
    if (file < 0) {
      const std::string reason = hdf5_reason();
      // A writer holds the file's lock (h5py's File(path, "w") not yet closed): its values may
      // be half written, so this is no damaged file but one to come back to.
      if (reason.find("unable to lock file") != std::string::npos)
        throw IoError(str(path, ": the HDF5 library cannot open it: ", reason, " (another process has it open for ",
                          "writing; close it there first, or set HDF5_USE_FILE_LOCKING=FALSE to read it as it stands)"));
      throw FormatError(str(path, ": the HDF5 library cannot open it: ", reason));
    }
    return file;
  }

  Opened open_dataset(const std::string& name, const std::string& what, hid_t access = H5P_DEFAULT) {
    Opened out;
    opened_name_ = name;
    out.dataset = Hid(H5Dopen2(file_.get(), name.c_str(), access), H5Dclose);
    if (!out.dataset) {
      // A dataset there but damaged is named as such, not as missing.
      const std::string reason = hdf5_reason();
      H5L_info_t link{};
      const bool external = H5Lexists(file_.get(), name.c_str(), H5P_DEFAULT) > 0 &&
                            H5Lget_info(file_.get(), name.c_str(), &link, H5P_DEFAULT) >= 0 &&
                            link.type == H5L_TYPE_EXTERNAL;
      H5Eclear2(H5E_DEFAULT);
      MMT_CHECK(!external, ValueError, what, ": an external link to another file, which cannot be opened (",
                reason, "); pack that file's dataset instead");
      const Objects objects = objects_of(file_.get(), path_);
      const std::string plain = name.starts_with('/') ? name.substr(1) : name;
      const auto among = [&](const std::vector<std::string>& names) {
        return std::find(names.begin(), names.end(), plain) != names.end();
      };
      MMT_CHECK(!among(objects.datasets), FormatError, what, ": cannot be opened (damaged?): ", reason);
      MMT_CHECK(!among(objects.others), FormatError, what, ": is no dataset but a committed datatype (or a dataset ",
                "whose header is damaged)");
      throw ValueError(str(path_, ": no dataset '", escaped(name), "' in the file; its datasets: ",
                           listed(objects.datasets)));
    }
    // Its values must be this file's: a dataset reached through an external link, stored in
    // external files (H5Pset_external) or virtual (views of other files) would read whatever
    // files the input names, on this machine.
    {
      char file_name[4096] = {};
      const ssize_t length = H5Fget_name(out.dataset.get(), file_name, sizeof file_name);
      std::error_code error;
      MMT_CHECK(length > 0 && static_cast<size_t>(length) < sizeof file_name &&
                    fs::equivalent(fs::path(file_name), fs::path(path_), error),
                ValueError, what, ": lies in another file (", escaped(std::string(file_name, std::max<ssize_t>(length, 0))),
                "), reached through an external link; pack that file's dataset instead");
    }
    out.file_type = Hid(H5Dget_type(out.dataset.get()), H5Tclose);
    const Hid space(H5Dget_space(out.dataset.get()), H5Sclose);
    out.create_plist = Hid(H5Dget_create_plist(out.dataset.get()), H5Pclose);
    if (!out.file_type || !space || !out.create_plist) throw FormatError(str(what, ": ", hdf5_reason()));
    MMT_CHECK(H5Pget_external_count(out.create_plist.get()) == 0, ValueError, what, ": its values are stored in ",
              "external files (H5Pset_external), which an input may not name: they could be any file on this machine");
    MMT_CHECK(H5Pget_layout(out.create_plist.get()) != H5D_VIRTUAL, ValueError, what, ": a virtual dataset (views of ",
              "other datasets, in other files): pack the datasets it maps instead");
    const ValueType value_type = value_type_of(out.file_type.get(), what);
    out.memory_type = Hid(value_type.memory_type, H5Tclose);
    out.dtype = value_type.dtype;
    const H5S_class_t space_class = H5Sget_simple_extent_type(space.get());
    MMT_CHECK(space_class == H5S_SIMPLE, ValueError, what, ": ", space_class == H5S_SCALAR ? "a scalar" : "no values",
              " (a ", space_class == H5S_SCALAR ? "scalar" : "null", " dataspace); an input's first dimension is its "
              "records, so a dataset must have at least one dimension");
    const int rank = H5Sget_simple_extent_ndims(space.get());
    MMT_CHECK(rank >= 1 && rank <= H5S_MAX_RANK, FormatError, what, ": a dataspace of ", rank, " dimensions");
    out.dims.resize(static_cast<size_t>(rank));
    H5Sget_simple_extent_dims(space.get(), out.dims.data(), nullptr);
    for (const hsize_t d : out.dims) {
      MMT_CHECK(d <= static_cast<hsize_t>(INT64_MAX), FormatError, what, ": a dimension of ", d, " values");
      out.sizes.push_back(static_cast<int64_t>(d));
    }
    out.nbytes = checked_shape_nbytes(IntArrayRef(out.sizes), element_size(out.dtype), what);
    return out;
  }

  // A contiguous, unfiltered dataset stored as it is read (little-endian) at an offset aligned
  // for its dtype: a view of the file's mapping. Undefined otherwise.
  Tensor view_in_place(const Opened& dataset, const std::string& what) {
    if (H5Pget_layout(dataset.create_plist.get()) != H5D_CONTIGUOUS ||
        H5Pget_external_count(dataset.create_plist.get()) != 0 ||
        H5Tequal(dataset.file_type.get(), dataset.memory_type.get()) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return {};
    }
    const haddr_t offset = H5Dget_offset(dataset.dataset.get());
    H5Eclear2(H5E_DEFAULT);
    const int64_t item = element_size(dataset.dtype), nbytes = dataset.nbytes;
    if (offset == HADDR_UNDEF || offset > static_cast<haddr_t>(file_bytes_) || offset % static_cast<haddr_t>(item) != 0)
      return {};  // never written (its fill value), or unaligned: read through the library
    MMT_CHECK(static_cast<int64_t>(offset) <= file_bytes_ - nbytes, FormatError, what, ": its ", nbytes,
              " bytes of values at byte ", offset, " run past the end of the ", file_bytes_, "-byte file (cut short?)");
    if (!mapping_) mapping_ = UntypedStorage::map_file(path_);
    MMT_CHECK(mapping_->nbytes() >= static_cast<int64_t>(offset) + nbytes, IoError, path_, ": the file shrank while ",
              "it was being read");
    return Tensor(*mapping_, dataset.dtype, IntArrayRef(dataset.sizes), static_cast<int64_t>(offset) / item);
  }

  // Any other dataset: read into a scratch file, a slab of whole chunks at a time: gzip and
  // shuffle chunks by this engine (hdf5_chunks.h), others by the library (which undoes their
  // filters and byte order).
  Tensor read_into_scratch(Opened& opened, const std::string& what) {
    const hid_t dataset = opened.dataset.get(), create_plist = opened.create_plist.get();
    const std::vector<hsize_t> dims = opened.dims;  // a copy: `opened` may be opened again below
    const int64_t nbytes = opened.nbytes;
    refuse_unavailable_filters(create_plist, what);
    // Values never written, where the dataset has no fill value or its fill time is NEVER
    // (h5py's fill_time='never', netCDF-4's NC_NOFILL), are not written by H5Dread either: it
    // leaves the buffer as it was, which for every slab after the first is the slab before.
    // They read as zeros (below), as the chunks decoded here and a first slab give them. (Asked
    // here: the tall-chunk path below opens the dataset again, closing create_plist.)
    H5D_fill_time_t fill_time = H5D_FILL_TIME_IFSET;
    H5D_fill_value_t fill_value = H5D_FILL_VALUE_DEFAULT;
    const bool reads_leave_unwritten_values = H5Pget_fill_time(create_plist, &fill_time) < 0 ||
                                              fill_time == H5D_FILL_TIME_NEVER ||
                                              H5Pfill_value_defined(create_plist, &fill_value) < 0 ||
                                              fill_value == H5D_FILL_VALUE_UNDEFINED;
    H5Eclear2(H5E_DEFAULT);
    const int64_t stored = static_cast<int64_t>(H5Dget_storage_size(dataset));
    MMT_CHECK(nbytes <= decode_limit(stored), ValueError, what, ": declares ", nbytes, " bytes of values but stores ",
              stored, ", past what an input may expand to (", kDecodeExpansion, " times its bytes, at least ",
              decode_limit(0), "): a damaged or hostile file, or a dataset never written");
    hsize_t chunk_rows = 1;
    std::vector<hsize_t> chunk_extent;  // a chunk's, when the library says it
    if (H5Pget_layout(create_plist) == H5D_CHUNKED) {
      std::vector<hsize_t> chunk(dims.size()), max_dims(dims.size());
      if (H5Pget_chunk(create_plist, static_cast<int>(chunk.size()), chunk.data()) == static_cast<int>(chunk.size())) {
        chunk_rows = std::max<hsize_t>(chunk[0], 1);
        chunk_extent = chunk;
      }
      // A chunk wider than a dimension that cannot grow is one no writer makes (libhdf5 refuses
      // to create it): a damaged file, whose chunk sizes would steer the reads below.
      const Hid space(H5Dget_space(dataset), H5Sclose);
      if (space && H5Sget_simple_extent_dims(space.get(), nullptr, max_dims.data()) == static_cast<int>(dims.size()))
        for (size_t d = 0; d < dims.size(); ++d)
          MMT_CHECK(max_dims[d] == H5S_UNLIMITED || chunk[d] <= max_dims[d], FormatError, what, ": chunks of ",
                    chunk[d], " in dimension ", d, ", which holds at most ", max_dims[d], " (a damaged file)");
      // The library decodes whole chunks: chunks far larger than the values (a dimension that
      // may grow, chunked past its extent) are what the read costs, held to the same limit.
      unsigned __int128 decoded = element_size(opened.dtype);
      for (size_t d = 0; d < dims.size(); ++d) {
        const hsize_t extent = std::max<hsize_t>(chunk[d], 1);
        decoded *= static_cast<unsigned __int128>(extent) * ((dims[d] + extent - 1) / extent);
        if (decoded > static_cast<unsigned __int128>(INT64_MAX)) break;
      }
      MMT_CHECK(decoded <= static_cast<unsigned __int128>(decode_limit(stored)), ValueError, what, ": its chunks (",
                IntArrayRef(std::vector<int64_t>(chunk.begin(), chunk.end())), ") decode to more than ",
                decode_limit(stored), " bytes for ", nbytes, " bytes of values, past what an input may expand to (",
                kDecodeExpansion, " times its ", stored, " bytes, at least ", decode_limit(0), "): a damaged or hostile file");
    }
    H5Eclear2(H5E_DEFAULT);
    const int64_t row_bytes = nbytes / opened.sizes[0];
    constexpr int64_t kSlabBytes = int64_t{32} << 20;
    // Chunks compressed with gzip (and shuffled), the way h5py writes them: decoded here, on
    // every CPU, rather than by the library on one (hdf5_chunks.h). Not chunk rows too large
    // for its slabs (chunks tall enough to hold a whole column, say): those go through the
    // library's cache below.
    const ChunkedDataset chunked{.dataset = opened.dataset.get(),
                                 .create_plist = create_plist,
                                 .file_type = opened.file_type.get(),
                                 .memory_type = opened.memory_type.get(),
                                 .dims = dims,
                                 .chunk = chunk_extent,
                                 .element_bytes = element_size(opened.dtype),
                                 .file_bytes = file_bytes_};
    if (!chunk_extent.empty() && chunks_read_here(chunked)) {
      ScratchFile scratch(what, str("to read this HDF5 dataset's values into (", nbytes, " bytes)"));
      scratch.reserve(nbytes);
      read_chunks_here(chunked, kSlabBytes, scratch, what);
      return Tensor(scratch.map(what), opened.dtype, IntArrayRef(opened.sizes));
    }
    hsize_t slab_rows = static_cast<hsize_t>(std::max<int64_t>(1, kSlabBytes / row_bytes));
    // Slabs of whole chunks read each chunk once; but chunks tall in the record dimension (a
    // column's values in one chunk) would make a slab of the whole dataset. Those are read a
    // bounded slab at a time, their chunks kept in the library's cache across slabs (up to
    // the decode floor: past it a chunk may be decoded again, slower but within memory).
    if (chunk_rows * static_cast<hsize_t>(row_bytes) <= static_cast<hsize_t>(4 * kSlabBytes)) {
      slab_rows = (slab_rows + chunk_rows - 1) / chunk_rows * chunk_rows;
    } else {
      const Hid access(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
      const auto cache_bytes = std::min<hsize_t>(chunk_rows * static_cast<hsize_t>(row_bytes),
                                                 static_cast<hsize_t>(decode_limit(0)));
      if (access && H5Pset_chunk_cache(access.get(), 100003, cache_bytes, 1.0) >= 0) {
        const std::string name = opened_name_;
        // Closed first: libhdf5 hands a second open of an open dataset the first one's cache.
        opened = Opened{};
        opened = open_dataset(name, what, access.get());
      }
      H5Eclear2(H5E_DEFAULT);
    }
    slab_rows = std::min<hsize_t>(slab_rows, dims[0]);

    ScratchFile scratch(what, str("to read this HDF5 dataset's values into (", nbytes, " bytes)"));
    scratch.reserve(nbytes);
    std::vector<std::byte> slab(static_cast<size_t>(slab_rows) * static_cast<size_t>(row_bytes));
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    for (hsize_t row = 0; row < dims[0]; row += slab_rows) {
      start[0] = row;
      count[0] = std::min(slab_rows, dims[0] - row);
      if (reads_leave_unwritten_values && row > 0)
        std::fill_n(slab.begin(), static_cast<size_t>(count[0]) * static_cast<size_t>(row_bytes), std::byte{0});
      const Hid file_space(H5Dget_space(opened.dataset.get()), H5Sclose);
      const Hid memory_space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
      if (!file_space || !memory_space ||
          H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0 ||
          H5Dread(opened.dataset.get(), opened.memory_type.get(), memory_space.get(), file_space.get(), H5P_DEFAULT,
                  slab.data()) < 0)
        throw FormatError(str(what, ": records [", row, ", ", row + count[0], "): the HDF5 library cannot read them: ",
                              hdf5_reason()));
      scratch.append(slab.data(), static_cast<int64_t>(count[0]) * row_bytes);
    }
    return Tensor(scratch.map(what), opened.dtype, IntArrayRef(opened.sizes));
  }

  static void check_bools(const Tensor& values, const std::string& what) {
    if (values.dtype() != kBool || values.numel() == 0) return;  // h5py's enum may hold other bytes
    guard_storage_reads(values.untyped_storage(), [&] {
      const auto* bytes = static_cast<const std::byte*>(values.data_ptr());
      const int64_t bad = first_invalid_bool(bytes, values.numel());
      MMT_CHECK(bad < 0, FormatError, what, ": bool element ", bad, " holds the byte ",
                static_cast<int>(static_cast<uint8_t>(bytes[bad])), "; a bool value may hold only 0 and 1");
    });
  }

  std::string path_;
  std::string opened_name_;  // the dataset open_dataset() last opened
  int64_t file_bytes_;
  Hid file_;
  std::optional<UntypedStorage> mapping_;  // the file's, made for the first dataset viewed in place
};

bool is_hdf5_file(const std::string& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) return false;
  std::ifstream in(path, std::ios::binary);
  unsigned char head[512] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  const auto got = static_cast<size_t>(in.gcount());
  if (got >= sizeof kSignature && std::memcmp(head, kSignature, sizeof kSignature) == 0) return true;
  // After a user block (512 bytes times a power of 2, of anything): but a file that begins as
  // another kind does is that kind, whatever it holds further on (an .npy of bytes, a zip, a
  // tar archive whose first member is an HDF5 file).
  const auto begins_with = [&](const char* magic, size_t n) { return got >= n && std::memcmp(head, magic, n) == 0; };
  if (begins_with("\x93NUMPY", 6) || begins_with("PK\x03\x04", 4) || begins_with("PK\x05\x06", 4) ||
      begins_with("\x89MMT\r\n\x1a\n", 8) || (got == sizeof head && std::memcmp(head + 257, "ustar", 5) == 0))
    return false;
  unsigned char magic[sizeof kSignature];
  in.clear();
  for (std::streamoff at = 512; at <= (std::streamoff{1} << 30); at *= 2) {
    in.seekg(at);
    if (!in.read(reinterpret_cast<char*>(magic), sizeof magic)) return false;
    if (std::memcmp(magic, kSignature, sizeof magic) == 0) return true;
  }
  return false;
}

namespace {

// A file named as HDF5 files are (.h5, .hdf5, .hdf, .he5) without the signature is not taken
// for another kind (an IDX file, whose check would say "not an IDX magic"): named here.
std::optional<Hdf5Input> hdf5_or_refused(const std::string& path, std::string dataset) {
  if (is_hdf5_file(path)) return Hdf5Input{path, std::move(dataset)};
  if (std::ifstream probe(path, std::ios::binary); !probe.is_open()) {  // unreadable: not judged by its bytes
    const int err = errno;
    throw IoError(str(path, ": cannot be read: ", std::strerror(err)), err);
  }
  const std::string extension = fs::path(path).extension().string();
  MMT_CHECK(extension != ".h5" && extension != ".hdf5" && extension != ".hdf" && extension != ".he5", FormatError, path,
            ": no HDF5 signature (\\x89HDF\\r\\n\\x1a\\n at its start or after a user block): not an HDF5 file, or one "
            "damaged at its start");
  return std::nullopt;
}

}  // namespace

std::optional<Hdf5Input> hdf5_input_of(const std::string& spec_path) {
  std::error_code error;
  if (fs::exists(spec_path, error)) {
    if (!fs::is_regular_file(spec_path, error)) return std::nullopt;
    return hdf5_or_refused(spec_path, "");
  }
  const auto file_and_dataset =
      split_at_file(spec_path, [&](const std::string& path) { return fs::is_regular_file(path, error); });
  if (!file_and_dataset) return std::nullopt;
  return hdf5_or_refused(file_and_dataset->first, file_and_dataset->second);
}

std::vector<Hdf5Array> load_hdf5(const Hdf5Input& input) {
  const QuietErrors quiet;
  const auto file = std::make_shared<Hdf5File>(input.path);
  std::vector<Hdf5Array> arrays;
  if (!input.dataset.empty()) {
    arrays.push_back(file->describe(input.dataset));
    return arrays;
  }
  const Objects objects = objects_of(file->id(), input.path);
  const std::vector<std::string>& names = objects.datasets;
  // Left out of a pack of the whole file, such an object could be a dataset lost to damage.
  MMT_CHECK(objects.others.empty(), FormatError, input.path, ": holds objects that are neither datasets nor groups (",
            listed(objects.others), ": committed datatypes, or datasets whose header is damaged); give each dataset ",
            "to pack as NAME=", input.path, ":DATASET");
  MMT_CHECK(!names.empty(), ValueError, input.path, ": the HDF5 file holds no datasets");
  std::vector<std::string> grouped;
  for (const std::string& name : names)
    if (name.find('/') != std::string::npos) grouped.push_back(name);
  MMT_CHECK(grouped.empty(), ValueError, input.path, ": holds datasets in groups (", listed(grouped), "), whose paths ",
            "are no field names; give each dataset to pack as NAME=", input.path, ":GROUP/DATASET");
  for (const std::string& name : names) {
    try {
      arrays.push_back(file->describe(name));
    } catch (const ValueError& e) {  // one dataset of many that cannot be packed: the way to leave it out
      throw ValueError(str(e.what(), " (to pack the file's other datasets, give each as NAME=", input.path,
                           ":DATASET)"));
    }
  }
  return arrays;
}

Tensor read_hdf5_values(const Hdf5Array& array) {
  if (array.values.defined()) return array.values;
  const QuietErrors quiet;
  return array.file->read(array);
}

}  // namespace mmt::detail
