// IDX files: the array format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/).
//
//     offset  size     field
//     0       4        magic, big-endian: 0x00 0x00 <element type> <rank>
//                      (type 0x08 = unsigned byte; images 0x00000803, labels 0x00000801)
//     4       4*rank   each dimension, big-endian u32 (images: count, rows, cols; labels: count)
//     ...     product  the elements, row-major
//
// Only unsigned-byte arrays are read (all that the image datasets use). Files may be gzip'd or
// raw: zlib's gzread passes raw files through unchanged, so both go through one code path.
//
// The reader never trusts the header for an allocation: the payload it declares is capped
// (max_idx_payload) and the buffer grows only as decompressed bytes actually arrive, so a
// corrupt or hostile header cannot make it reserve gigabytes for a file that holds kilobytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusion {

/// The largest payload (product of the dimensions, in bytes) read_idx accepts: 2^31 bytes,
/// over 40 times Fashion-MNIST's training images.
inline constexpr int64_t max_idx_payload = int64_t{1} << 31;

/// The unsigned-byte array of an IDX file.
struct idx_array {
  std::vector<int64_t> dims;  ///< from the header, each at least 1 (a count may be 0)
  std::vector<uint8_t> data;  ///< row-major, product(dims) bytes
};

/// What an IDX file is expected to hold; it fixes the magic and names the file in errors.
enum class idx_kind {
  images,  ///< magic 0x00000803: (count, rows, cols) unsigned bytes
  labels,  ///< magic 0x00000801: (count) unsigned bytes
};

/// Reads the IDX file at `path` (gzip'd or raw). Throws std::runtime_error naming the path:
///   "IDX file PATH not found: install Debian's dataset-fashion-mnist (scripts/setup.sh)",
///   "PATH is not an IDX image file (magic 0x00000801, expected 0x00000803)",
///   "PATH ends after N of M bytes" (header and payload together), "PATH has N bytes after
///   its M-byte payload", a zero row or column count, a payload over max_idx_payload, or a
///   damaged gzip stream.
idx_array read_idx(const std::string& path, idx_kind kind);

/// The bytes of an IDX file of `kind` holding `dims` and `data` (product(dims) bytes; the
/// rank must match the kind), for writing fixtures and converted datasets. Throws
/// std::invalid_argument when the sizes disagree.
std::string encode_idx(idx_kind kind, const std::vector<int64_t>& dims, const std::vector<uint8_t>& data);

}  // namespace fusion
