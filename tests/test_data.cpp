// data/: corpus loading (raw, gzip, splits, bad files), random-crop batches, fixed windows, text.
// The synthetic files hold pos_byte(i) at offset i, a hash of the position, so every split
// boundary and every crop can be checked against the exact offset it must come from.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "data/corpus.h"
#include "tests/corpus_files_util.h"

namespace fd = flashcos::data;

namespace {

using flashcos::test::pattern;
using flashcos::test::pos_byte;
using flashcos::test::sizes;

// A fresh temp directory per test, removed with its files afterwards.
class DataTest : public flashcos::test::CorpusFilesTest {};

void expect_bytes(const at::Tensor& t, int64_t offset, int64_t n) {
  ASSERT_EQ(t.dim(), 1);
  ASSERT_EQ(t.scalar_type(), at::kByte);
  ASSERT_EQ(t.numel(), n);
  at::Tensor c = t.contiguous();
  const uint8_t* p = c.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(p[i], pos_byte(offset + i)) << "byte " << i << " of a split starting at " << offset;
}

using flashcos::test::error_of;  // a std::runtime_error's message

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "'" << (part) << "' not in: " << (msg)

}  // namespace

// ---- parse_split ---------------------------------------------------------------------------------

TEST(DataSplit, ParsesByteCountsWithSuffixes) {
  auto s = fd::parse_split("90M,5M,5M");
  EXPECT_FALSE(s.fractions);
  EXPECT_EQ(s.sizes.train, 90'000'000);
  EXPECT_EQ(s.sizes.val, 5'000'000);
  EXPECT_EQ(s.sizes.test, 5'000'000);
  s = fd::parse_split("90000000,5000000,5000000");
  EXPECT_EQ(s.sizes.total(), 100'000'000);
  s = fd::parse_split(" 2k , 1.5K,7 ");
  EXPECT_EQ(s.sizes.train, 2000);
  EXPECT_EQ(s.sizes.val, 1500);
  EXPECT_EQ(s.sizes.test, 7);
  s = fd::parse_split("1G,0,1m");
  EXPECT_EQ(s.sizes.train, 1'000'000'000);
  EXPECT_EQ(s.sizes.val, 0);
  EXPECT_EQ(s.sizes.test, 1'000'000);
  EXPECT_EQ(fd::to_string(fd::parse_split("90M,5M,5M")), "90M,5M,5M");
  EXPECT_EQ(fd::to_string(fd::parse_split("1234,5K,1G")), "1234,5K,1G");
  EXPECT_EQ(fd::to_string(fd::SplitSpec{}), "90M,5M,5M");  // the defaults
}

TEST(DataSplit, ParsesFractions) {
  auto s = fd::parse_split("0.9,0.05,0.05");
  EXPECT_TRUE(s.fractions);
  EXPECT_DOUBLE_EQ(s.f_train, 0.9);
  EXPECT_DOUBLE_EQ(s.f_val, 0.05);
  EXPECT_DOUBLE_EQ(s.f_test, 0.05);
  EXPECT_EQ(fd::to_string(s), "0.9,0.05,0.05");
  s = fd::parse_split("0.95,0.05,0");  // a plain 0 is a zero fraction here
  EXPECT_TRUE(s.fractions);
  EXPECT_DOUBLE_EQ(s.f_train, 0.95);
  EXPECT_DOUBLE_EQ(s.f_test, 0.0);
  EXPECT_EQ(fd::to_string(s), "0.95,0.05,0");
}

TEST(DataSplit, RejectsBadSpecsNamingThePart) {
  auto msg = [](const std::string& spec) {
    try {
      fd::parse_split(spec);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error for '" << spec << "'";
    return std::string();
  };
  EXPECT_HAS(msg("90M,5M"), "2 part");
  EXPECT_HAS(msg("90M,5M,5M,1"), "4 part");
  EXPECT_HAS(msg("90M,x,5M"), "val part 'x'");
  EXPECT_HAS(msg("90M,5M,"), "test part '' is empty");
  EXPECT_HAS(msg("-1,5M,5M"), "train part '-1'");
  EXPECT_HAS(msg("90Q,5M,5M"), "train part '90Q'");
  EXPECT_HAS(msg("1.2.3,5M,5M"), "train part");
  EXPECT_HAS(msg("1.0001K,5M,5M"), "whole number");
  EXPECT_HAS(msg("0.9,5M,5M"), "mixes fractions");
  EXPECT_HAS(msg("0.9,0.1,0.1"), "add up to");
  EXPECT_HAS(msg("1.5,0.1,0.1"), "above 1");
  EXPECT_HAS(msg("0,0,0"), "all zero");
  EXPECT_HAS(msg("0.0,0.0,0.0"), "all zero");
}

// ---- load_corpus ---------------------------------------------------------------------------------

TEST_F(DataTest, RawFileSplitsAtExactBoundaries) {
  auto p = write_raw("raw.bin", pattern(10'007));
  auto c = fd::load_corpus(p, sizes(7000, 2000, 1000), 17);
  EXPECT_EQ(c.path, p);
  EXPECT_FALSE(c.gzip);
  EXPECT_EQ(c.file_bytes, 10'007);  // the last 7 bytes are in no split
  expect_bytes(c.train, 0, 7000);
  expect_bytes(c.val, 7000, 2000);
  expect_bytes(c.test, 9000, 1000);
  EXPECT_TRUE(c.train.device().is_cpu());
  // Views of one buffer, in file order.
  EXPECT_EQ(c.train.data_ptr<uint8_t>() + 7000, c.val.data_ptr<uint8_t>());
  EXPECT_EQ(c.val.data_ptr<uint8_t>() + 2000, c.test.data_ptr<uint8_t>());
}

// The sample prime: n bytes of the val split at the offset the callback picks, by a seek in a raw
// file and by decompression in a gzip one (the same bytes), with load_corpus's checks.
TEST_F(DataTest, ValSliceSeeksRawAndDecompressesGzip) {
  auto bytes = pattern(10'007);
  auto raw = write_raw("raw.bin", bytes);
  auto gz = write_gz("raw.gz", bytes);
  for (const auto& p : {raw, gz}) {
    for (int64_t off : {int64_t(0), int64_t(777), int64_t(2000 - 129)}) {
      int64_t seen_val = -1;
      auto t = fd::load_val_slice(p, sizes(7000, 2000, 1000), 129, [&](int64_t val) {
        seen_val = val;
        return off;
      });
      EXPECT_EQ(seen_val, 2000) << p;
      expect_bytes(t, 7000 + off, 129);
    }
    fd::SplitSpec frac;
    frac.fractions = true, frac.f_train = 0.5, frac.f_val = 0.25, frac.f_test = 0.25;
    auto t = fd::load_val_slice(p, frac, 5, [](int64_t val) { return val - 5; });
    const int64_t val_start = std::llround(0.5 * 10'007) - (std::llround(0.5 * 10'007) + 2 * std::llround(0.25 * 10'007) > 10'007 ? 1 : 0);
    expect_bytes(t, val_start + std::llround(0.25 * 10'007) - 5, 5);
    // Too small a val split for the slice, or a file too small for the split: load_corpus's errors.
    EXPECT_HAS(error_of([&] { fd::load_val_slice(p, sizes(7000, 100, 1000), 129, [](int64_t) { return 0; }); }),
               "val split");
    EXPECT_HAS(error_of([&] { fd::load_val_slice(p, sizes(9000, 2000, 1000), 3, [](int64_t) { return 0; }); }),
               "holds 10007 bytes");
  }
  EXPECT_HAS(error_of([&] { fd::load_val_slice(path("missing.bin"), sizes(1, 1, 1), 1, [](int64_t) { return 0; }); }),
             "not found");
}

TEST_F(DataTest, GzipFileGivesTheSameBytes) {
  auto bytes = pattern(300'001);
  auto g = write_gz("c.gz", bytes);
  auto c = fd::load_corpus(g, sizes(200'000, 50'000, 50'001), 2);
  EXPECT_TRUE(c.gzip);
  EXPECT_EQ(c.file_bytes, 300'001);
  expect_bytes(c.train, 0, 200'000);
  expect_bytes(c.val, 200'000, 50'000);
  expect_bytes(c.test, 250'000, 50'001);
}

TEST_F(DataTest, GzipDetectedByMagicNotName) {
  auto bytes = pattern(5000);
  auto g = write_gz("looks_raw.txt", bytes);
  auto r = write_raw("looks_raw.bin", bytes);
  auto cg = fd::load_corpus(g, sizes(4000, 500, 500), 1);
  auto cr = fd::load_corpus(r, sizes(4000, 500, 500), 1);
  EXPECT_TRUE(cg.gzip);
  EXPECT_FALSE(cr.gzip);
  EXPECT_TRUE(cg.train.equal(cr.train));
  EXPECT_TRUE(cg.test.equal(cr.test));
  // A name ending in .gz promises gzip: raw bytes under it are refused, not trained on (issue 18).
  auto fake = write_raw("looks_gz.gz", bytes);
  try {
    fd::load_corpus(fake, sizes(4000, 500, 500), 1);
    ADD_FAILURE() << "raw bytes named .gz were loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("looks_gz.gz' ends in .gz but is not gzip"), std::string::npos) << e.what();
  }
}

TEST_F(DataTest, ConcatenatedGzipMembersAreOneCorpus) {
  auto all = pattern(90'000);
  std::vector<uint8_t> a(all.begin(), all.begin() + 40'000), b(all.begin() + 40'000, all.end());
  auto g = write_gz("multi.gz", a);
  write_gz("multi.gz", b, "ab");
  auto c = fd::load_corpus(g, sizes(60'000, 20'000, 10'000), 1);
  EXPECT_EQ(c.file_bytes, 90'000);
  expect_bytes(c.train, 0, 60'000);
  expect_bytes(c.val, 60'000, 20'000);
  expect_bytes(c.test, 80'000, 10'000);
}

TEST_F(DataTest, FractionsResolveAgainstTheFileSize) {
  auto p = write_raw("f.bin", pattern(10'000));
  auto c = fd::load_corpus(p, fd::parse_split("0.9,0.05,0.05"), 10);
  expect_bytes(c.train, 0, 9000);
  expect_bytes(c.val, 9000, 500);
  expect_bytes(c.test, 9500, 500);
  // Odd sizes: rounding never reaches past the file.
  auto q = write_raw("odd.bin", pattern(1001));
  auto d = fd::load_corpus(q, fd::parse_split("0.3335,0.3335,0.333"), 1);
  EXPECT_LE(d.train.numel() + d.val.numel() + d.test.numel(), 1001);
  expect_bytes(d.val, d.train.numel(), d.val.numel());
  expect_bytes(d.test, d.train.numel() + d.val.numel(), d.test.numel());
}

TEST_F(DataTest, MissingFileErrorNamesFileAndDownloadScript) {
  std::string p = dir_ + "/nope/enwik8.gz";
  auto m = error_of([&] { fd::load_corpus(p, fd::SplitSpec{}, 1); });
  EXPECT_HAS(m, p);
  EXPECT_HAS(m, "not found");
  EXPECT_HAS(m, "scripts/download_enwik8.sh");
}

TEST_F(DataTest, DirectoryIsRejected) {
  auto m = error_of([&] { fd::load_corpus(dir_, fd::SplitSpec{}, 1); });
  EXPECT_HAS(m, dir_);
  EXPECT_HAS(m, "directory");
}

TEST_F(DataTest, UnreadableFileErrorNamesFile) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads files whatever their permissions";
  auto p = write_raw("secret.bin", pattern(100));
  chmod(p.c_str(), 0);
  auto m = error_of([&] { fd::load_corpus(p, sizes(10, 10, 10), 1); });
  EXPECT_HAS(m, p);
  EXPECT_HAS(m, "unreadable");
}

TEST_F(DataTest, TruncatedGzipIsAnErrorAtEveryCut) {
  auto g = write_gz("full.gz", pattern(200'000));
  auto z = read_all(g);
  // Cut inside the header, the deflate data and the 8-byte CRC/ISIZE trailer.
  for (size_t keep : {size_t(5), size_t(12), z.size() / 3, z.size() / 2, z.size() - 5, z.size() - 1}) {
    std::vector<uint8_t> cut(z.begin(), z.begin() + keep);
    auto p = write_raw("cut" + std::to_string(keep) + ".gz", cut);
    auto m = error_of([&] { fd::load_corpus(p, sizes(10, 10, 10), 1); });
    EXPECT_HAS(m, p);
    EXPECT_HAS(m, "truncated or corrupt gzip");
    EXPECT_HAS(m, "scripts/download_enwik8.sh");
  }
}

TEST_F(DataTest, CorruptGzipIsAnError) {
  auto g = write_gz("good.gz", pattern(200'000));
  auto z = read_all(g);
  auto flipped = z;
  for (size_t i = z.size() / 2; i < z.size() / 2 + 16; ++i) flipped[i] ^= 0x5a;
  auto p = write_raw("flipped.gz", flipped);
  auto m = error_of([&] { fd::load_corpus(p, sizes(10, 10, 10), 1); });
  EXPECT_HAS(m, p);
  EXPECT_HAS(m, "truncated or corrupt gzip");
  // A wrong CRC alone (data intact) is caught too.
  auto badcrc = z;
  badcrc[z.size() - 8] ^= 1;
  auto q = write_raw("badcrc.gz", badcrc);
  EXPECT_HAS(error_of([&] { fd::load_corpus(q, sizes(10, 10, 10), 1); }), "corrupt gzip");
  // Garbage after the stream is not silently ignored.
  auto tail = z;
  tail.insert(tail.end(), {'j', 'u', 'n', 'k'});
  auto r = write_raw("tail.gz", tail);
  EXPECT_HAS(error_of([&] { fd::load_corpus(r, sizes(10, 10, 10), 1); }), "unexpected data");
}

TEST_F(DataTest, FileSmallerThanSplitNamesSizesAndFixes) {
  auto p = write_raw("small.bin", pattern(4321));
  auto m = error_of([&] { fd::load_corpus(p, fd::SplitSpec{}, 1); });
  EXPECT_HAS(m, p);
  EXPECT_HAS(m, "4321 bytes");
  EXPECT_HAS(m, "100000000");
  EXPECT_HAS(m, "90M,5M,5M");
  EXPECT_HAS(m, "--split");
  EXPECT_HAS(m, "scripts/download_enwik8.sh");
  auto g = write_gz("small.gz", pattern(4321));
  auto mg = error_of([&] { fd::load_corpus(g, sizes(4000, 300, 22), 1); });
  EXPECT_HAS(mg, "4321 bytes after decompression");
  EXPECT_HAS(mg, "4322");
  // An empty file is just a very small one.
  auto e = write_raw("empty.bin", {});
  EXPECT_HAS(error_of([&] { fd::load_corpus(e, sizes(1, 1, 1), 1); }), "0 bytes");
}

TEST_F(DataTest, SplitSmallerThanOneSequenceIsAnError) {
  auto p = write_raw("s.bin", pattern(10'000));
  auto m = error_of([&] { fd::load_corpus(p, sizes(8000, 990, 1000), 991); });
  EXPECT_HAS(m, p);
  EXPECT_HAS(m, "val split");
  EXPECT_HAS(m, "has 990 bytes");
  EXPECT_HAS(m, "991 bytes");
  EXPECT_HAS(m, "--seq-len");
  EXPECT_HAS(error_of([&] { fd::load_corpus(p, sizes(9000, 990, 10), 257); }), "test split");
  // Exactly seq_len + 1 bytes is enough.
  auto c = fd::load_corpus(p, sizes(9000, 990, 10), 10);
  EXPECT_EQ(c.test.numel(), 10);
}

// A reader of one split (eval, the sample's prime) checks that split alone, in its own words; the
// others may be empty.
TEST_F(DataTest, OneSplitNeedChecksOnlyThatSplit) {
  auto p = write_raw("one.bin", pattern(10'000));
  const auto test_only = fd::SplitNeed::only("test", "one window needs (--seq-len + 1)", "pass a larger test split");
  auto c = fd::load_corpus(p, sizes(0, 0, 10'000), 257, test_only);
  EXPECT_EQ(c.train.numel(), 0);
  EXPECT_EQ(c.val.numel(), 0);
  EXPECT_EQ(c.test.numel(), 10'000);
  auto m = error_of([&] { fd::load_corpus(p, sizes(9'900, 0, 100), 257, test_only); });
  EXPECT_HAS(m, "test split");
  EXPECT_HAS(m, "has 100 bytes");
  EXPECT_HAS(m, "one window needs (--seq-len + 1): pass a larger test split");
  // The default still checks every split.
  EXPECT_HAS(error_of([&] { fd::load_corpus(p, sizes(0, 0, 10'000), 257); }), "train split");
  // The val slice checks the val split only: an empty test split is fine.
  const auto slice = fd::load_val_slice(p, sizes(7'000, 3'000, 0), 129, [](int64_t val) { return val - 129; });
  EXPECT_EQ(slice.numel(), 129);
  EXPECT_EQ(slice[0].item<int>(), int(pattern(10'000)[9'871]));
  EXPECT_HAS(error_of([&] { fd::load_val_slice(p, sizes(9'950, 50, 0), 129, [](int64_t) { return 0; }); }),
             "the slice needs (n + 1): use a larger val split or a shorter slice");
  EXPECT_THROW(fd::SplitNeed::only("dev", "", ""), std::invalid_argument);
}

// ---- BatchSampler --------------------------------------------------------------------------------

TEST_F(DataTest, SamplerCropsAreContiguousSlicesOfTheSplit) {
  auto p = write_raw("s.bin", pattern(5000));
  auto c = fd::load_corpus(p, sizes(1000, 3000, 1000), 1);
  const int64_t T = 63, B = 5, offset = 1000;  // sample from val: its bytes start at file offset 1000
  fd::BatchSampler s(c.val, T, B, 1234);
  EXPECT_EQ(s.seq_len(), T);
  EXPECT_EQ(s.batch(), B);
  std::set<int64_t> starts;
  for (int it = 0; it < 200; ++it) {
    at::Tensor x = s.next();
    ASSERT_EQ(x.scalar_type(), at::kLong);
    ASSERT_EQ(x.sizes(), (std::vector<int64_t>{B, T + 1}));
    const int64_t* d = x.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      // The crop must equal the file bytes at exactly one start inside the val split.
      int64_t start = -1, matches = 0;
      for (int64_t st = 0; st + T + 1 <= 3000; ++st) {
        bool ok = true;
        for (int64_t t = 0; t <= T && ok; ++t) ok = d[b * (T + 1) + t] == pos_byte(offset + st + t);
        if (ok) start = st, ++matches;
      }
      ASSERT_EQ(matches, 1) << "crop is not a slice of the val split";
      starts.insert(start);
    }
  }
  EXPECT_GT(starts.size(), 500u);  // 1000 draws over 2937 starts
}

TEST_F(DataTest, SamplerReachesBothEndsOfATinySplit) {
  auto p = write_raw("t.bin", pattern(100));
  auto c = fd::load_corpus(p, sizes(10, 10, 10), 1);
  fd::BatchSampler exact(c.train, 9, 3, 7);  // 10 bytes, one possible crop
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(exact.next().equal(c.train.to(at::kLong).unsqueeze(0).expand({3, 10})));
  fd::BatchSampler two(c.train, 8, 1, 7);  // starts 0 and 1
  std::set<int64_t> first;
  for (int i = 0; i < 64; ++i) first.insert(two.next()[0][0].item<int64_t>());
  EXPECT_EQ(first, (std::set<int64_t>{pos_byte(0), pos_byte(1)}));
}

TEST_F(DataTest, SamplerIsDeterministicPerSeed) {
  auto p = write_raw("d.bin", pattern(20'000));
  auto c = fd::load_corpus(p, sizes(10'000, 5000, 5000), 1);
  fd::BatchSampler a(c.train, 127, 4, 42), b(c.train, 127, 4, 42), other(c.train, 127, 4, 43);
  bool differs = false;
  for (int i = 0; i < 10; ++i) {
    at::Tensor xa = a.next(), xb = b.next(), xo = other.next();
    EXPECT_TRUE(xa.equal(xb));
    differs |= !xa.equal(xo);
  }
  EXPECT_TRUE(differs);
  // Pinned out of the box when CUDA is there, so the trainer can copy non_blocking.
  EXPECT_EQ(a.next().is_pinned(), at::hasCUDA());
}

TEST_F(DataTest, SamplerStateRoundTripsExactly) {
  auto p = write_raw("r.bin", pattern(20'000));
  auto c = fd::load_corpus(p, sizes(10'000, 5000, 5000), 1);
  fd::BatchSampler s(c.train, 31, 3, 2024);
  for (int i = 0; i < 7; ++i) s.next();
  const std::string st = s.state();
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 5; ++i) expected.push_back(s.next());
  // A sampler with another seed, restored, continues exactly where the first one was.
  fd::BatchSampler r(c.train, 31, 3, 1);
  r.load_state(st);
  EXPECT_EQ(r.state(), st);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(r.next().equal(expected[i])) << "batch " << i;
  // And the original one rewinds.
  s.load_state(st);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(s.next().equal(expected[i]));
}

TEST_F(DataTest, SamplerRejectsGarbageStateAndKeepsItsOwn) {
  auto p = write_raw("g.bin", pattern(2000));
  auto c = fd::load_corpus(p, sizes(1000, 500, 500), 1);
  fd::BatchSampler s(c.train, 15, 2, 5);
  const std::string good = s.state();
  for (const std::string& bad : {std::string(""), std::string("hello"), good.substr(0, good.size() / 2),
                                 good + " 17", std::string("1 2 3")}) {
    try {
      s.load_state(bad);
      ADD_FAILURE() << "accepted a bad state of " << bad.size() << " chars";
    } catch (const std::invalid_argument& e) {
      EXPECT_HAS(std::string(e.what()), "load_state");
      EXPECT_HAS(std::string(e.what()), "mt19937_64");
    }
    EXPECT_EQ(s.state(), good);  // unchanged after a failed load
  }
}

TEST_F(DataTest, SamplerRejectsBadArguments) {
  auto p = write_raw("b.bin", pattern(100));
  auto c = fd::load_corpus(p, sizes(10, 10, 10), 1);
  EXPECT_THROW(fd::BatchSampler(c.train, 10, 1, 0), std::invalid_argument);  // needs 11 bytes
  EXPECT_THROW(fd::BatchSampler(c.train, 0, 1, 0), std::invalid_argument);
  EXPECT_THROW(fd::BatchSampler(c.train, 4, 0, 0), std::invalid_argument);
  EXPECT_THROW(fd::BatchSampler(c.train.to(at::kLong), 4, 1, 0), std::invalid_argument);
}

// ---- fixed_windows -------------------------------------------------------------------------------

TEST_F(DataTest, FixedWindowsTileTheSplitWithoutOverlappingTargets) {
  auto p = write_raw("w.bin", pattern(3000));
  auto c = fd::load_corpus(p, sizes(1000, 1000, 1000), 1);
  const int64_t T = 100, off = 2000;  // test split
  at::Tensor w = fd::fixed_windows(c.test, T, 0);
  ASSERT_EQ(w.scalar_type(), at::kLong);
  ASSERT_EQ(w.sizes(), (std::vector<int64_t>{9, T + 1}));  // (1000 - 1) / 100 windows
  for (int64_t k = 0; k < 9; ++k)
    for (int64_t t = 0; t <= T; ++t) ASSERT_EQ(w[k][t].item<int64_t>(), pos_byte(off + k * T + t));
  // Targets (columns 1..T) cover bytes 1..900 once each.
  for (int64_t k = 0; k + 1 < 9; ++k) EXPECT_EQ(w[k][T].item<int64_t>(), w[k + 1][0].item<int64_t>());
  EXPECT_TRUE(fd::fixed_windows(c.test, T, 0).equal(w));  // deterministic
  EXPECT_TRUE(fd::fixed_windows(c.test, T, 9).equal(w));
  EXPECT_TRUE(fd::fixed_windows(c.test, T, 1000).equal(w));
  // Three evenly spaced: windows 0, 3, 6.
  at::Tensor w3 = fd::fixed_windows(c.test, T, 3);
  ASSERT_EQ(w3.size(0), 3);
  EXPECT_TRUE(w3[0].equal(w[0]));
  EXPECT_TRUE(w3[1].equal(w[3]));
  EXPECT_TRUE(w3[2].equal(w[6]));
  EXPECT_TRUE(fd::fixed_windows(c.test, T, 1)[0].equal(w[0]));
}

TEST_F(DataTest, FixedWindowsEdgeSizes) {
  auto p = write_raw("e.bin", pattern(3000));
  auto c = fd::load_corpus(p, sizes(1000, 1000, 1000), 1);
  EXPECT_EQ(fd::fixed_windows(c.val.narrow(0, 0, 128), 127, 0).size(0), 1);  // exactly T + 1
  EXPECT_EQ(fd::fixed_windows(c.val.narrow(0, 0, 254), 127, 0).size(0), 1);
  EXPECT_EQ(fd::fixed_windows(c.val.narrow(0, 0, 255), 127, 0).size(0), 2);
  at::Tensor w1 = fd::fixed_windows(c.val, 1, 0);  // T = 1: every byte pair
  EXPECT_EQ(w1.size(0), 999);
  EXPECT_EQ(w1[998][1].item<int64_t>(), pos_byte(1999));
  EXPECT_THROW(fd::fixed_windows(c.val.narrow(0, 0, 127), 127, 0), std::invalid_argument);
}

// ---- text ----------------------------------------------------------------------------------------

TEST(DataText, EncodeDecodeRoundTrip) {
  at::Tensor t = fd::encode_text("Hi\n\t~");
  ASSERT_EQ(t.sizes(), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(t.scalar_type(), at::kLong);
  EXPECT_EQ(t[0][0].item<int64_t>(), 'H');
  EXPECT_EQ(t[0][2].item<int64_t>(), 10);
  EXPECT_EQ(fd::decode_bytes(t), "Hi\n\t~");
  const std::string utf8 = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";  // café € 😀
  at::Tensor u = fd::encode_text(utf8);
  EXPECT_EQ(u[0][3].item<int64_t>(), 0xC3);  // bytes, not code points
  EXPECT_EQ(fd::decode_bytes(u), utf8);
  EXPECT_EQ(fd::encode_text("").sizes(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(fd::decode_bytes(fd::encode_text("")), "");
}

TEST(DataText, NonPrintableBytesBecomeQuestionMarks) {
  auto dec = [](std::vector<int64_t> v) {
    return fd::decode_bytes(at::tensor(v, at::TensorOptions().dtype(at::kLong)));
  };
  EXPECT_EQ(dec({'a', 0, 'b', 1, 27, 127, '\r'}), "a?b????");
  EXPECT_EQ(dec({0xC3}), "?");                     // lead byte cut off
  EXPECT_EQ(dec({0xC3, 'a'}), "?a");               // lead byte without continuation
  EXPECT_EQ(dec({0xA9, 'x'}), "?x");               // stray continuation
  EXPECT_EQ(dec({0xC0, 0x80}), "??");              // overlong NUL
  EXPECT_EQ(dec({0xED, 0xA0, 0x80}), "???");       // surrogate
  EXPECT_EQ(dec({0xFF, 256, -1, 'z'}), "???z");    // not a byte at all
  // Any integer dtype and shape: a (B, T) batch decodes row after row.
  at::Tensor b = at::tensor(std::vector<int64_t>{'a', 'b', 'c', 'd'}).view({2, 2}).to(at::kByte);
  EXPECT_EQ(fd::decode_bytes(b), "abcd");
}

// ---- real corpora, when present ----------------------------------------------------------------

// FLASHCOS_ENWIK8_PREFIX=<path to enwik8-first-4154064-bytes.gz>: the real enwik8 prefix.
TEST(DataReal, Enwik8PrefixLoads) {
  const char* p = std::getenv("FLASHCOS_ENWIK8_PREFIX");
  if (!p || !*p) GTEST_SKIP() << "set FLASHCOS_ENWIK8_PREFIX to the enwik8 prefix (.gz) to run this";
  auto c = fd::load_corpus(p, fd::parse_split("0.9,0.05,0.05"), 8193);
  EXPECT_EQ(c.file_bytes, 4'154'064);
  EXPECT_EQ(c.train.numel() + c.val.numel() + c.test.numel(), 4'154'064);
  const std::string head = fd::decode_bytes(c.train.narrow(0, 0, 64));
  EXPECT_EQ(head.rfind("<mediawiki xmlns=\"http://www.mediawiki.org/xml/export-0.3/\"", 0), 0u) << head;
  // The file ends after the page of Alliaceae.
  const std::string tail = fd::decode_bytes(c.test.narrow(0, c.test.numel() - 8, 8));
  EXPECT_EQ(tail, "</page>\n");
  fd::BatchSampler s(c.train, 8192, 4, 0);
  at::Tensor x = s.next();
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{4, 8193}));
  EXPECT_GE(x.min().item<int64_t>(), 0);
  EXPECT_LE(x.max().item<int64_t>(), 255);
  EXPECT_EQ(fd::fixed_windows(c.val, 8192, 0).size(0), (c.val.numel() - 1) / 8192);
}

// FLASHCOS_CORPUS_100M=<path>: a 100,000,000-byte corpus (enwik8 or the substitute), default split.
TEST(DataReal, FullCorpusLoadsWithDefaultSplit) {
  const char* p = std::getenv("FLASHCOS_CORPUS_100M");
  if (!p || !*p) GTEST_SKIP() << "set FLASHCOS_CORPUS_100M to a 100 MB corpus (raw or .gz) to run this";
  auto t0 = std::chrono::steady_clock::now();
  auto c = fd::load_corpus(p, fd::SplitSpec{}, 8193);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ load     ] %s: %lld bytes%s in %.2f s\n", p, (long long)c.file_bytes,
              c.gzip ? " (gzip)" : "", s);
  EXPECT_EQ(c.file_bytes, 100'000'000);
  EXPECT_EQ(c.train.numel(), 90'000'000);
  EXPECT_EQ(c.val.numel(), 5'000'000);
  EXPECT_EQ(c.test.numel(), 5'000'000);
  EXPECT_EQ(c.val.data_ptr<uint8_t>(), c.train.data_ptr<uint8_t>() + 90'000'000);
}
