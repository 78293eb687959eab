// A temporary folder of corpus files for the data tests (test_data, test_val_slice): raw and gzip
// files written by the test, removed (with the folder) after it; and the byte pattern and split
// specs those tests build their corpora and splits from.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/corpus.h"

namespace flashcos::test {

inline uint8_t pos_byte(int64_t i) {  // splitmix64 of the offset: no short run of bytes repeats
  uint64_t z = uint64_t(i) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint8_t>(z ^ (z >> 31));
}

// Bytes offset .. offset + n - 1 of the pattern: every slice is unique.
inline std::vector<uint8_t> pattern(int64_t n, int64_t offset = 0) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = pos_byte(offset + i);
  return v;
}

// The message of the E that f throws (fails the test if none).
template <class E = std::runtime_error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// A split given as three byte counts.
inline data::SplitSpec sizes(int64_t a, int64_t b, int64_t c) {
  data::SplitSpec s;
  s.sizes = data::SplitSizes{a, b, c};
  return s;
}

class CorpusFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "flashcos_corpus_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    ASSERT_NE(mkdtemp(buf.data()), nullptr);
    dir_ = buf.data();
  }
  void TearDown() override {
    for (const auto& f : files_) std::remove(f.c_str());
    chmod(dir_.c_str(), 0700);  // a test may have taken its permissions away
    rmdir(dir_.c_str());
  }
  std::string path(const std::string& name) {
    files_.push_back(dir_ + "/" + name);
    return files_.back();
  }
  std::string write_raw(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  // Written with zlib's own gzip writer, in several calls as a real writer would; mode "ab" appends
  // a second gzip member to an existing file. nullptr: the fixture's gz_mode_.
  std::string write_gz(const std::string& name, const std::vector<uint8_t>& bytes, const char* mode = nullptr) {
    if (mode == nullptr) mode = gz_mode_;
    const std::string p = dir_ + "/" + name;
    if (std::string(mode) != "ab") files_.push_back(p);
    gzFile g = gzopen(p.c_str(), mode);
    EXPECT_NE(g, nullptr);
    size_t off = 0;
    while (off < bytes.size()) {
      const unsigned n = static_cast<unsigned>(std::min<size_t>(bytes.size() - off, 1 << 16));
      EXPECT_EQ(gzwrite(g, bytes.data() + off, n), int(n));
      off += n;
    }
    EXPECT_EQ(gzclose(g), Z_OK);
    return p;
  }
  static std::vector<uint8_t> read_all(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
  }

  const char* gz_mode_ = "wb9";  // compression of write_gz's default
  std::string dir_;
  std::vector<std::string> files_;
};

}  // namespace flashcos::test
