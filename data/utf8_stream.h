// Streaming text output of sampled bytes: what decode_bytes (corpus.h) prints for a whole sample,
// printed a byte at a time. A UTF-8 sequence whose continuation bytes have not come yet is held back
// until they do (or until a byte shows it cannot complete), so that `./train sample --stream`
// prints the same text as the whole sample decoded at once: the concatenation of push() over a
// sequence of bytes, then finish(), equals decode_bytes of the sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashcos::data {

class Utf8Stream {
 public:
  // The text that byte (0..255) completes: "" while a sequence is incomplete.
  std::string push(int64_t byte);
  // Whatever is held back (an unfinished sequence decodes as decode_bytes decodes it: '?' per byte).
  std::string finish();

 private:
  std::vector<int64_t> pending_;
};

}  // namespace flashcos::data
