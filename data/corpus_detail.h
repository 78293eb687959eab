// Internal to data/: pieces of corpus.cpp that the streaming val slice (val_slice.cpp) shares, so
// both report the same errors in the same words. Not part of the public corpus.h contract.
#pragma once

#include <cstdint>
#include <string>

#include "data/corpus.h"

namespace flashcos::data::detail {

inline constexpr const char* kDownloadHint =
    "get enwik8 with scripts/download_enwik8.sh (it writes data/enwik8 and data/enwik8.gz), "
    "or pass --data <file>";

// The split's byte counts for a file of n (decompressed) bytes, checked: errors name the file and
// what it lacks (too small for the split, a split smaller than min_split_bytes).
SplitSizes resolve_split_sizes(const std::string& path, const SplitSpec& split, int64_t n, bool gzip,
                               int64_t min_split_bytes);

}  // namespace flashcos::data::detail
