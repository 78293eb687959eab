// Utf8Stream (data/utf8_stream.h): the text `./train sample --stream` prints a byte at a time must be
// the text the whole sample decodes to (decode_bytes), on random byte strings that mix ASCII, every
// kind of well-formed sequence, and the broken ones (cut, overlong, surrogates, stray continuation
// bytes, invalid lead bytes), and a sequence must print as soon as its last byte comes.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <random>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "data/utf8_stream.h"

namespace {

namespace fd = flashcos::data;

std::string decode_all(const std::vector<int64_t>& bytes) {
  return fd::decode_bytes(at::tensor(bytes, at::kLong));
}

std::string streamed(const std::vector<int64_t>& bytes) {
  fd::Utf8Stream s;
  std::string out;
  for (int64_t b : bytes) out += s.push(b);
  return out + s.finish();
}

TEST(Utf8Stream, StreamedTextIsTheWholeSampleDecoded) {
  std::mt19937 rng(1234);
  // Pieces: ASCII, well-formed 2 / 3 / 4-byte characters, and bytes that break them.
  const std::vector<std::vector<int64_t>> pieces = {
      {'a'}, {'\n'}, {0x7F}, {0xC3, 0xA9}, {0xD0, 0xA7}, {0xE2, 0x82, 0xAC}, {0xED, 0x9F, 0xBF},
      {0xF0, 0x9F, 0x98, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}, {0xC3}, {0xE2, 0x82}, {0xF0, 0x9F, 0x98},
      {0x80}, {0xBF}, {0xC0, 0x80}, {0xE0, 0x80, 0x80}, {0xED, 0xA0, 0x80}, {0xF4, 0x90, 0x80, 0x80},
      {0xF5}, {0xFF}, {0x00}};
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> bytes;
    const int n = int(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const auto& p = pieces[rng() % pieces.size()];
      bytes.insert(bytes.end(), p.begin(), p.end());
    }
    if (trial % 4 == 0)
      for (auto& b : bytes) b = rng() % 256;  // and plain random bytes
    ASSERT_EQ(streamed(bytes), decode_all(bytes)) << "trial " << trial;
  }
}

TEST(Utf8Stream, ACharacterPrintsWithItsLastByte) {
  fd::Utf8Stream s;
  EXPECT_EQ(s.push('h'), "h");
  EXPECT_EQ(s.push(0xE2), "");
  EXPECT_EQ(s.push(0x82), "");
  EXPECT_EQ(s.push(0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(s.push(0xC3), "");
  EXPECT_EQ(s.push('x'), "?x");  // cut by an ASCII byte: the lead byte is '?', as decode_bytes has it
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.finish(), "?");  // unfinished at the end
  EXPECT_EQ(s.finish(), "");
}

}  // namespace
