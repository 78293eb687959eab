// Byte-level corpus: enwik8 (or any file, raw or .gz) split into train / val / test, plus the
// batch sources the trainer and the evaluator read.
//
//   Corpus c = load_corpus("data/enwik8.gz", SplitSizes{}, /*min_bytes=*/seq_len + 1);
//   BatchSampler s(c.train, seq_len, batch, seed);   at::Tensor x = s.next();  // (B, T+1) int64
//   at::Tensor w = fixed_windows(c.val, seq_len, 64); // (N, T+1) int64, deterministic
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>

namespace flashcos::data {

// Byte counts of the three splits, taken in order from the start of the file.
struct SplitSizes {
  int64_t train = 90'000'000;
  int64_t val = 5'000'000;
  int64_t test = 5'000'000;
  int64_t total() const { return train + val + test; }
};

// Parses "90M,5M,5M", "90000000,5000000,5000000" (K/M/G suffixes, powers of 1000), or fractions
// of the file "0.9,0.05,0.05" (resolved against the file size by load_corpus: then
// `fractions` is set). Throws std::invalid_argument naming the bad part.
struct SplitSpec {
  SplitSizes sizes;
  bool fractions = false;
  double f_train = 0, f_val = 0, f_test = 0;
};
SplitSpec parse_split(const std::string& spec);
// "90M,5M,5M" / "0.9,0.05,0.05" back as text (for logs, config tables and error messages).
std::string to_string(const SplitSpec& spec);

struct Corpus {
  std::string path;
  at::Tensor train, val, test;  // uint8, CPU, 1-D views of one buffer
  int64_t file_bytes = 0;       // bytes in the (decompressed) file; bytes past the splits are unused
  bool gzip = false;            // whether the file was gzip-compressed
};

// Reads a raw or gzip file (detected by magic bytes). Errors (std::runtime_error) name the file,
// what was wrong (missing, unreadable, truncated gzip, too small for the split or for
// min_split_bytes per split) and point to scripts/download_enwik8.sh.
// `path` when it exists, else `path`.gz when that exists, else `path` (load_corpus then reports it).
std::string resolve_corpus_path(const std::string& path);

// Which splits must hold at least min_split_bytes, and the words of the error when one does not:
// "the <name> split ... has N bytes, fewer than the M bytes <what>: <fix>". The default is the
// trainer's: every split, one sequence of seq_len + 1 bytes. A reader of one split (eval, the
// sample's prime) checks only that one, so that the others may be empty.
struct SplitNeed {
  bool train = true, val = true, test = true;
  std::string what = "one sequence needs (seq_len + 1)";
  std::string fix = "use a larger --split or a smaller --seq-len";
  static SplitNeed only(const std::string& name, std::string what, std::string fix);  // "train" | "val" | "test"
  static SplitNeed val_slice() {  // load_val_slice's default
    return only("val", "the slice needs (n + 1)", "use a larger val split or a shorter slice");
  }
};

Corpus load_corpus(const std::string& path, const SplitSpec& split, int64_t min_split_bytes,
                   const SplitNeed& need = {});

// n bytes of the val split (uint8, CPU) from offset pick_offset(val bytes) in [0, val - n]: a raw
// file is read with one seek (the rest is never read), a gzip file is inflated as a stream that
// keeps only those n bytes (data/val_slice.cpp; the corpus is never held in memory). The same
// checks and errors as load_corpus(path, split, n + 1, need), where need checks the val split only
// (the default's words: "the slice needs (n + 1)"). pick_offset must be a function of its
// argument alone: with a fraction --split and a gzip file whose ISIZE trailer is not its size
// (several members, 4 GiB or more) it is called a second time, with the true val size.
at::Tensor load_val_slice(const std::string& path, const SplitSpec& split, int64_t n,
                          const std::function<int64_t(int64_t)>& pick_offset,
                          const SplitNeed& need = SplitNeed::val_slice());

// Random crops of seq_len + 1 bytes from one split, from a seeded generator whose state can be
// saved and restored exactly (checkpoints / --resume).
class BatchSampler {
 public:
  BatchSampler(at::Tensor split, int64_t seq_len, int64_t batch, uint64_t seed);
  // (batch, seq_len + 1) int64 on the CPU (pinned when CUDA is available, for async copies).
  at::Tensor next();
  std::string state() const;             // generator state as text
  void load_state(const std::string& s);  // throws std::invalid_argument on a bad state
  int64_t seq_len() const { return seq_len_; }
  int64_t batch() const { return batch_; }

 private:
  at::Tensor split_;
  int64_t seq_len_, batch_;
  std::mt19937_64 gen_;
};

// Deterministic windows of seq_len + 1 bytes whose targets do not overlap: window w starts at
// w * seq_len. max_windows <= 0 takes all of them; otherwise max_windows evenly spaced ones.
// Returns (N, seq_len + 1) int64 on the CPU.
at::Tensor fixed_windows(const at::Tensor& split, int64_t seq_len, int64_t max_windows);

// Bytes -> printable text (non-printable bytes become '?'), and text -> (1, n) int64 tokens.
// decode_bytes keeps '\n', '\t', printable ASCII and well-formed UTF-8 sequences; any other byte
// (control characters, stray UTF-8 bytes, values outside 0..255) becomes '?'.
std::string decode_bytes(const at::Tensor& tokens);
at::Tensor encode_text(const std::string& text);

}  // namespace flashcos::data
