// data/val_slice.cpp + data/gzip_scan.cpp: the sample prime read from a gzip corpus as a stream
// gives the same bytes as from the raw file (offsets at the start, across the 4 MiB buffer
// boundary, the last valid one), calls pick_offset as often as load_corpus would, and fails with
// load_corpus's own messages for bad files.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#include "data/corpus.h"
#include "tests/corpus_files_util.h"
#include "data/gzip_scan.h"

namespace fd = flashcos::data;

namespace {

using flashcos::test::pattern;
using flashcos::test::sizes;

fd::SplitSpec fractions(double a, double b, double c) {
  fd::SplitSpec s;
  s.fractions = true, s.f_train = a, s.f_val = b, s.f_test = c;
  s.sizes = fd::SplitSizes{0, 0, 0};
  return s;
}

std::vector<uint8_t> bytes_of(const at::Tensor& t) {
  const auto c = t.contiguous();
  return std::vector<uint8_t>(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel());
}

template <class F>
std::string error_of(F&& f) {  // any std::exception's message
  return flashcos::test::error_of<std::exception>(std::forward<F>(f));
}

class ValSliceTest : public flashcos::test::CorpusFilesTest {
 protected:
  ValSliceTest() { gz_mode_ = "wb1"; }  // large files: fast compression
};

}  // namespace

// 9 MB (three 4 MiB inflate buffers): the train split ends 50 bytes before the first buffer
// boundary, so offset 0 straddles it; the last valid offset ends the val split.
TEST_F(ValSliceTest, GzipStreamGivesTheRawBytesAtEveryOffset) {
  const int64_t total = 9'000'000, train = (int64_t(4) << 20) - 50, val = 3'000'000, n = 129;
  const auto bytes = pattern(total);
  const auto raw = write_raw("corpus.bin", bytes);
  const auto gz = write_gz("corpus.gz", bytes);
  const auto split = sizes(train, val, total - train - val);
  for (int64_t off : {int64_t(0), int64_t(1), int64_t(2'000'000), val - n - 1, val - n}) {
    int calls_raw = 0, calls_gz = 0;
    const auto a = fd::load_val_slice(raw, split, n, [&](int64_t v) { ++calls_raw; EXPECT_EQ(v, val); return off; });
    const auto b = fd::load_val_slice(gz, split, n, [&](int64_t v) { ++calls_gz; EXPECT_EQ(v, val); return off; });
    EXPECT_EQ(calls_raw, 1);
    EXPECT_EQ(calls_gz, 1);
    const std::vector<uint8_t> want(bytes.begin() + train + off, bytes.begin() + train + off + n);
    EXPECT_EQ(bytes_of(a), want) << "raw, offset " << off;
    EXPECT_EQ(bytes_of(b), want) << "gzip, offset " << off;
  }
  // The prime's own picker (a fresh seeded generator per call) lands on the same bytes either way.
  for (uint64_t seed : {0ull, 1ull, 12345ull}) {
    auto pick = [&](int64_t v) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
      return at::randint(v - n, {1}, gen).item<int64_t>();
    };
    EXPECT_EQ(bytes_of(fd::load_val_slice(raw, split, n, pick)), bytes_of(fd::load_val_slice(gz, split, n, pick)));
  }
  // A gzip file is found by its magic bytes, not its name.
  const auto disguised = write_gz("corpus.data", bytes);
  EXPECT_EQ(bytes_of(fd::load_val_slice(disguised, split, n, [](int64_t) { return 7; })),
            std::vector<uint8_t>(bytes.begin() + train + 7, bytes.begin() + train + 7 + n));
}

// Fraction splits need the file size before the offset: from the ISIZE trailer when it is right
// (one pick), again from the true size when it is not (two members: ISIZE is the second's).
TEST_F(ValSliceTest, FractionSplitsUseTheTrailerAndRecoverWhenItLies) {
  const int64_t total = 100'003, n = 64;
  const auto bytes = pattern(total);
  const auto split = fractions(0.8, 0.1, 0.1);
  const auto raw = write_raw("f.bin", bytes);
  const auto one = write_gz("one.gz", bytes);
  const auto two = write_gz("two.gz", std::vector<uint8_t>(bytes.begin(), bytes.begin() + 70'000));
  write_gz("two.gz", std::vector<uint8_t>(bytes.begin() + 70'000, bytes.end()), "ab");
  EXPECT_EQ(fd::gzip_isize(one), total);
  EXPECT_EQ(fd::gzip_isize(two), total - 70'000);
  const auto c = fd::load_corpus(raw, split, n + 1);
  const int64_t val = c.val.numel();
  for (int64_t off : {int64_t(0), int64_t(5'000), val - n}) {
    const auto want = bytes_of(c.val.slice(0, off, off + n));
    std::vector<int64_t> seen;
    auto pick = [&](int64_t v) { seen.push_back(v); return std::min(off, v - n); };
    EXPECT_EQ(bytes_of(fd::load_val_slice(raw, split, n, pick)), want);
    EXPECT_EQ(bytes_of(fd::load_val_slice(one, split, n, pick)), want);
    EXPECT_EQ(seen, (std::vector<int64_t>{val, val}));
    seen.clear();
    EXPECT_EQ(bytes_of(fd::load_val_slice(two, split, n, pick)), want);
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back(), val);  // the offset that counts saw the true val size
  }
}

// Every bad gzip file fails as load_corpus fails on it, in the same words.
TEST_F(ValSliceTest, BadGzipFilesGiveLoadCorpusErrors) {
  const auto bytes = pattern(200'000);
  const auto good = write_gz("good.gz", bytes);
  const auto z = read_all(good);
  std::vector<std::string> bad;
  for (size_t keep : {size_t(5), size_t(12), z.size() / 2, z.size() - 5, z.size() - 1}) {
    bad.push_back(write_raw("cut" + std::to_string(keep) + ".gz", std::vector<uint8_t>(z.begin(), z.begin() + keep)));
  }
  auto flipped = z;
  for (size_t i = z.size() / 2; i < z.size() / 2 + 16; ++i) flipped[i] ^= 0x5a;
  bad.push_back(write_raw("flipped.gz", flipped));
  auto badcrc = z;
  badcrc[z.size() - 8] ^= 1;
  bad.push_back(write_raw("badcrc.gz", badcrc));
  auto tail = z;
  tail.insert(tail.end(), {'j', 'u', 'n', 'k'});
  bad.push_back(write_raw("tail.gz", tail));
  bad.push_back(write_raw("fake.gz", bytes));  // raw bytes named .gz
  const auto split = sizes(100'000, 50'000, 50'000);
  for (const auto& p : bad) {
    const auto want = error_of([&] { fd::load_corpus(p, split, 17); });
    EXPECT_EQ(error_of([&] { fd::load_val_slice(p, split, 16, [](int64_t) { return 0; }); }), want) << p;
  }
  // A file too small for the split, and a val split too small for the slice.
  const auto small = write_gz("small.gz", pattern(4321));
  for (const auto& split_n : {std::make_pair(sizes(4000, 300, 22), int64_t(3)), std::make_pair(sizes(4000, 100, 22), int64_t(200))}) {
    const auto want = error_of([&] { fd::load_corpus(small, split_n.first, split_n.second + 1, fd::SplitNeed::val_slice()); });
    EXPECT_EQ(error_of([&] { fd::load_val_slice(small, split_n.first, split_n.second, [](int64_t) { return 0; }); }), want);
  }
  const auto missing = dir_ + "/missing.gz";
  EXPECT_EQ(error_of([&] { fd::load_val_slice(missing, split, 16, [](int64_t) { return 0; }); }),
            error_of([&] { fd::load_corpus(missing, split, 17); }));
}

// Zero padding after the last member is accepted (as load_corpus accepts it).
TEST_F(ValSliceTest, ZeroPaddingAfterTheStreamIsAccepted) {
  const auto bytes = pattern(50'000);
  auto z = read_all(write_gz("p.gz", bytes));
  z.insert(z.end(), 1000, 0);
  const auto padded = write_raw("padded.gz", z);
  const auto t = fd::load_val_slice(padded, sizes(30'000, 10'000, 10'000), 32, [](int64_t) { return 100; });
  EXPECT_EQ(bytes_of(t), std::vector<uint8_t>(bytes.begin() + 30'100, bytes.begin() + 30'132));
  EXPECT_EQ(fd::scan_gzip(padded, -1, 0, nullptr), 50'000);
}
