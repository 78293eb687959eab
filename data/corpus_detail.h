// Internal to data/: pieces of corpus.cpp that the streaming val slice (val_slice.cpp, gzip_scan.cpp)
// shares, so both report the same errors in the same words. Not part of the public corpus.h contract.
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "data/corpus.h"

namespace flashcos::data::detail {

inline constexpr const char* kDownloadHint =
    "get enwik8 with scripts/download_enwik8.sh (it writes data/enwik8 and data/enwik8.gz), "
    "or pass --data <file>";

// The split's byte counts for a file of n (decompressed) bytes, checked: errors name the file and
// what it lacks (too small for the split, a split that need checks smaller than min_split_bytes).
SplitSizes resolve_split_sizes(const std::string& path, const SplitSpec& split, int64_t n, bool gzip,
                               int64_t min_split_bytes, const SplitNeed& need);

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A gzip file that does not inflate: the error names the file, why, and its compressed size.
std::runtime_error gzip_corrupt(const std::string& path, const std::string& why, size_t compressed_bytes);

// After inflate() returned `rc` (not Z_STREAM_END; `msg` is zlib's): throws for bad data or zlib
// running out of memory, returns for Z_OK / Z_BUF_ERROR (the caller checks whether input ran out).
void check_inflate(int rc, const char* msg, const std::string& path, size_t compressed_bytes);

}  // namespace flashcos::data::detail
