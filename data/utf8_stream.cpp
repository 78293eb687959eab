// decode_byte_values and Utf8Stream (utf8_stream.h). The decoder goes left to right, and a sequence
// that starts before a lead byte never reaches past it (a lead byte is no continuation byte), so
// the bytes before the last lead byte decode the same alone as followed by the rest: the stream
// keeps back only a tail that starts with a lead byte and holds fewer than its length of
// continuation bytes.
#include "data/utf8_stream.h"

#include <cstddef>

namespace flashcos::data {
namespace {

// The length of the sequence a lead byte starts (0: not a lead byte).
int sequence_length(int64_t c) {
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

bool continuation(int64_t c) { return c >= 0x80 && c <= 0xBF; }

}  // namespace

std::string decode_byte_values(const int64_t* p, int64_t n) {
  std::string out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n;) {
    const int64_t c = p[i];
    if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7F)) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const int len = sequence_length(c);
    bool ok = len > 0;
    for (int k = 1; ok && k < len; ++k) ok = i + k < n && continuation(p[i + k]);
    if (ok && len >= 3) {
      const int64_t c1 = p[i + 1];
      if (c == 0xE0 && c1 < 0xA0) ok = false;  // overlong
      if (c == 0xED && c1 > 0x9F) ok = false;  // surrogate
      if (c == 0xF0 && c1 < 0x90) ok = false;  // overlong
      if (c == 0xF4 && c1 > 0x8F) ok = false;  // above U+10FFFF
    }
    if (!ok) {
      out += '?';
      ++i;
      continue;
    }
    for (int k = 0; k < len; ++k) out += static_cast<char>(p[i + k]);
    i += len;
  }
  return out;
}

std::string Utf8Stream::push(int64_t byte) {
  pending_.push_back(byte);
  // The last lead byte among the last 3 (a 4-byte sequence is complete with 4), if every byte after
  // it is a continuation byte and there are fewer than the sequence needs: hold from there.
  const size_t n = pending_.size();
  size_t hold = n;
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const int64_t c = pending_[n - back];
    if (continuation(c)) continue;  // look further back
    if (static_cast<size_t>(sequence_length(c)) > back) hold = n - back;
    break;  // ASCII, an invalid byte or a complete sequence: everything before `hold` decodes now
  }
  std::string out = decode_byte_values(pending_.data(), static_cast<int64_t>(hold));
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(hold));
  return out;
}

std::string Utf8Stream::finish() {
  std::string out = decode_byte_values(pending_.data(), static_cast<int64_t>(pending_.size()));
  pending_.clear();
  return out;
}

}  // namespace flashcos::data
