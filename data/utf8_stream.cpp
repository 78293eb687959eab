// Utf8Stream (utf8_stream.h). decode_bytes decodes left to right, and a sequence that starts before
// a lead byte never reaches past it (a lead byte is no continuation byte), so the bytes before the
// last lead byte decode the same alone as followed by the rest: only a tail that starts with a lead
// byte and holds fewer than its length of continuation bytes is kept back.
#include "data/utf8_stream.h"

#include <ATen/ATen.h>

#include "data/corpus.h"

namespace flashcos::data {
namespace {

// The length decode_bytes expects from a lead byte (0: not one).
int sequence_length(int64_t c) {
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

std::string decode(const std::vector<int64_t>& bytes, size_t n) {
  if (n == 0) return "";
  return decode_bytes(at::from_blob(const_cast<int64_t*>(bytes.data()), {static_cast<int64_t>(n)}, at::kLong));
}

}  // namespace

std::string Utf8Stream::push(int64_t byte) {
  pending_.push_back(byte);
  // The last lead byte among the last 3 (a 4-byte sequence is complete with 4), if every byte after
  // it is a continuation byte and there are fewer than the sequence needs: hold from there.
  const size_t n = pending_.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t k = n - back;
    const int64_t c = pending_[k];
    if (c >= 0x80 && c <= 0xBF) continue;  // a continuation byte: look further back
    const int len = sequence_length(c);
    if (len > 0 && static_cast<size_t>(len) > back) {
      std::string out = decode(pending_, k);
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(k));
      return out;
    }
    break;  // ASCII, an invalid byte or a complete sequence: everything decodes now
  }
  std::string out = decode(pending_, n);
  pending_.clear();
  return out;
}

std::string Utf8Stream::finish() {
  std::string out = decode(pending_, pending_.size());
  pending_.clear();
  return out;
}

}  // namespace flashcos::data
