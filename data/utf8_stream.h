// Sampled bytes -> printable text: the decoder behind decode_bytes (corpus.h), and the same text a
// byte at a time for `./train sample --stream`. Utf8Stream holds back a UTF-8 sequence whose
// continuation bytes have not come yet, until they do (or a byte shows it cannot complete), so that
// the concatenation of push() over a sequence of bytes, then finish(), equals decode_bytes of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashcos::data {

// '\n', '\t', printable ASCII and well-formed UTF-8 sequences (no overlongs, surrogates or code
// points above U+10FFFF) pass through; any other value (control characters, stray UTF-8 bytes,
// values outside 0..255) becomes '?'.
std::string decode_byte_values(const int64_t* bytes, int64_t n);

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
