// Streaming inflate of a gzip file that keeps nothing but one byte range: the val slice of a .gz
// corpus (sample's prime, data/val_slice.cpp) without materialising the decompressed corpus.
//
//   std::vector<uint8_t> buf(n);
//   int64_t total = scan_gzip("data/enwik8.gz", 90'000'000 + off, n, buf.data());
#pragma once

#include <cstdint>
#include <string>

namespace flashcos::data {

// Inflates the whole gzip file at `path` (one or more members, zero padding after the last one
// allowed) through fixed 4 MiB input and output buffers, copies decompressed bytes [from, from + n)
// into dst and returns the decompressed size of the file. Bytes of the range past the end of the
// file are left untouched (the caller compares the returned size with from + n); from < 0 copies
// nothing. The whole stream is inflated, so the CRC and length trailers are checked as
// load_corpus checks them. Errors (std::runtime_error) are load_corpus's, in the same words:
// missing or unreadable file, truncated or corrupt gzip, unexpected data after the stream.
int64_t scan_gzip(const std::string& path, int64_t from, int64_t n, uint8_t* dst);

// The gzip ISIZE trailer (the last 4 bytes: the uncompressed size mod 2^32 of the last member):
// the decompressed size of a single-member file under 4 GiB, -1 if the file is shorter than a
// gzip header and trailer (18 bytes) or unreadable. Only a guess: a multi-member, larger or
// damaged file reports something else.
int64_t gzip_isize(const std::string& path);

}  // namespace flashcos::data
