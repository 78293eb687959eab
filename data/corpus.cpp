// Byte corpus loading (raw or gzip), train/val/test splits, random-crop batches and fixed windows.
// See corpus.h for the contract. The whole (decompressed) file lives in one malloc'd buffer that
// the three split tensors view; the buffer is freed when the last of them goes away.
#include "data/corpus.h"

#include <fstream>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>
#include <sys/stat.h>

#include "common/log.h"
#include "data/corpus_detail.h"
#include "data/utf8_stream.h"

namespace flashcos::data {
namespace {

using detail::kDownloadHint;

// ---- split parsing ---------------------------------------------------------------------------

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// "90M" -> bytes (suffix K/M/G = powers of 1000), "0.9" -> fraction. Returns true for a fraction.
bool parse_part(const std::string& spec, const std::string& part, const char* name, int64_t* bytes,
                double* fraction) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument(strf(
        "--split '%s': the %s part '%s' %s; expected three byte counts like 90M,5M,5M "
        "(suffix K/M/G = 1e3/1e6/1e9) or three fractions of the file like 0.9,0.05,0.05",
        spec.c_str(), name, part.c_str(), why.c_str()));
  };
  if (part.empty()) throw bad("is empty");
  double mult = 1;
  std::string num = part;
  char last = part.back();
  if (last == 'k' || last == 'K') mult = 1e3;
  if (last == 'm' || last == 'M') mult = 1e6;
  if (last == 'g' || last == 'G') mult = 1e9;
  if (mult != 1) num = part.substr(0, part.size() - 1);
  if (num.empty() || num.find_first_not_of("0123456789.") != std::string::npos ||
      num.find('.') != num.rfind('.') || num == ".")
    throw bad("is not a non-negative number");
  double v = std::strtod(num.c_str(), nullptr);
  bool has_dot = num.find('.') != std::string::npos;
  if (mult == 1 && has_dot) {  // a fraction of the file
    if (v > 1) throw bad("is a fraction above 1");
    *fraction = v;
    return true;
  }
  double b = v * mult;
  if (b > 9e18) throw bad("is too large");
  if (std::fabs(b - std::llround(b)) > 1e-6) throw bad("is not a whole number of bytes");
  *bytes = std::llround(b);
  return false;
}

std::string human_bytes(int64_t n) {
  if (n >= 1'000'000'000 && n % 1'000'000'000 == 0) return strf("%lldG", (long long)(n / 1'000'000'000));
  if (n >= 1'000'000 && n % 1'000'000 == 0) return strf("%lldM", (long long)(n / 1'000'000));
  if (n >= 1'000 && n % 1'000 == 0) return strf("%lldK", (long long)(n / 1'000));
  return strf("%lld", (long long)n);
}

// ---- file reading ----------------------------------------------------------------------------

// A malloc'd byte buffer that grows geometrically; handed to the tensor deleter at the end.
struct Buffer {
  uint8_t* data = nullptr;
  size_t size = 0, cap = 0;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data); }
  void reset() { std::free(release()); }
  void take(Buffer& o) {  // becomes o, leaving o empty
    reset();
    std::swap(data, o.data);
    std::swap(size, o.size);
    std::swap(cap, o.cap);
  }
  void reserve(size_t n) {
    if (n <= cap) return;
    void* p = std::realloc(data, n);
    if (!p) throw std::runtime_error(strf("out of memory allocating %zu bytes for the corpus", n));
    data = static_cast<uint8_t*>(p);
    cap = n;
  }
  uint8_t* release() {
    uint8_t* p = data;
    data = nullptr;
    size = cap = 0;
    return p;
  }
};

using detail::ends_with;
using detail::FileCloser;

std::string errno_text(int err) { return std::strerror(err); }

// Reads the whole file into `out`. Errors name the file and the cause.
void read_file(const std::string& path, Buffer* out) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR)
      throw std::runtime_error(strf("data file '%s' not found: %s", path.c_str(), kDownloadHint));
    throw std::runtime_error(strf("data file '%s' is unreadable (%s): check the path and its "
                                  "permissions, or %s",
                                  path.c_str(), errno_text(err).c_str(), kDownloadHint));
  }
  if (S_ISDIR(st.st_mode))
    throw std::runtime_error(strf("data file '%s' is a directory, expected a file (raw bytes or "
                                  ".gz): pass the file itself, e.g. --data data/enwik8.gz",
                                  path.c_str()));
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f)
    throw std::runtime_error(strf("data file '%s' is unreadable (%s): check its permissions, or %s",
                                  path.c_str(), errno_text(errno).c_str(), kDownloadHint));
  // st_size is exact for regular files; other kinds (pipes) just grow the buffer.
  size_t hint = S_ISREG(st.st_mode) ? static_cast<size_t>(st.st_size) : (size_t(1) << 20);
  out->reserve(hint + 1);
  for (;;) {
    if (out->size == out->cap) out->reserve(out->cap * 2);
    size_t got = std::fread(out->data + out->size, 1, out->cap - out->size, f.get());
    out->size += got;
    if (got == 0) break;
  }
  if (std::ferror(f.get()))
    throw std::runtime_error(strf("data file '%s' is unreadable: read error (%s) after %zu bytes",
                                  path.c_str(), errno_text(errno).c_str(), out->size));
}

bool is_gzip(const Buffer& b) { return b.size >= 2 && b.data[0] == 0x1f && b.data[1] == 0x8b; }

// A file named *.gz that does not start with the gzip magic bytes (1f 8b) would otherwise be
// trained on as raw bytes: name what it looks like instead.
void require_gzip_magic(const std::string& path, const Buffer& b) {
  auto starts = [&](std::initializer_list<int> magic) {
    size_t i = 0;
    for (int m : magic) {
      if (i >= b.size || b.data[i] != m) return false;
      ++i;
    }
    return true;
  };
  std::string looks;
  if (starts({'B', 'Z', 'h'})) looks = " (it looks like bzip2: decompress it with bunzip2 first)";
  else if (starts({0xfd, '7', 'z', 'X', 'Z'})) looks = " (it looks like xz: decompress it with unxz first)";
  else if (starts({0x28, 0xb5, 0x2f, 0xfd})) looks = " (it looks like zstd: decompress it with unzstd first)";
  else if (starts({'P', 'K', 3, 4})) looks = " (it looks like a zip archive: unzip it first)";
  std::string head;
  for (size_t i = 0; i < std::min<size_t>(4, b.size); ++i) head += strf("%s%02x", i ? " " : "", b.data[i]);
  throw std::runtime_error(strf("data file '%s' ends in .gz but is not gzip: it starts with bytes [%s], gzip starts "
                                "with 1f 8b%s. Pass a real gzip file or the raw file (without .gz).",
                                path.c_str(), head.c_str(), looks.c_str()));
}

// Inflates a gzip file (one or more members) held in `in` into `out`, in large chunks straight
// into one buffer sized from the ISIZE trailer (uncompressed size mod 2^32) as a hint.
void gunzip(const std::string& path, const Buffer& in, Buffer* out) {
  auto corrupt = [&](const std::string& why) { return detail::gzip_corrupt(path, why, in.size); };
  size_t hint = 0;
  if (in.size >= 18) {
    const uint8_t* t = in.data + in.size - 4;
    hint = size_t(t[0]) | size_t(t[1]) << 8 | size_t(t[2]) << 16 | size_t(t[3]) << 24;
  }
  // ISIZE wraps past 4 GiB, lies for multi-member files and is garbage in a truncated file: keep it
  // between the input size and deflate's best ratio (about 1032:1).
  hint = std::min(std::max(hint, in.size), in.size * 1032);
  out->reserve(hint + 1);

  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK)  // 16: expect the gzip wrapper, check CRC + ISIZE
    throw std::runtime_error(strf("zlib inflateInit2 failed for '%s'", path.c_str()));
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);

  size_t in_pos = 0;
  constexpr size_t kChunk = size_t(1) << 30;  // avail_in / avail_out are 32-bit
  for (;;) {
    if (out->size == out->cap) out->reserve(out->cap + out->cap / 2 + (size_t(1) << 20));
    size_t in_left = in.size - in_pos, out_left = out->cap - out->size;
    zs.next_in = in.data + in_pos;
    zs.avail_in = static_cast<uInt>(std::min(in_left, kChunk));
    zs.next_out = out->data + out->size;
    zs.avail_out = static_cast<uInt>(std::min(out_left, kChunk));
    uInt avail_in0 = zs.avail_in, avail_out0 = zs.avail_out;
    int rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += avail_in0 - zs.avail_in;
    out->size += avail_out0 - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Another gzip member may follow (concatenated .gz files are valid gzip); zero padding is
      // tolerated, anything else is not ours to guess about.
      size_t rest = in.size - in_pos;
      if (rest == 0) break;
      if (rest >= 2 && in.data[in_pos] == 0x1f && in.data[in_pos + 1] == 0x8b) {
        inflateReset(&zs);
        continue;
      }
      bool zeros = true;
      for (size_t i = in_pos; i < in.size && zeros; ++i) zeros = in.data[i] == 0;
      if (zeros) break;
      throw corrupt(strf("%zu bytes of unexpected data after the gzip stream at offset %zu", rest,
                         in_pos));
    }
    detail::check_inflate(rc, zs.msg, path, in.size);
    // Z_BUF_ERROR means no progress was possible: with output room left, the input ran out.
    if (in_pos == in.size && zs.avail_out > 0)
      throw corrupt(strf("the stream ends early after %zu decompressed bytes", out->size));
  }
}

std::string split_desc(const SplitSpec& s) { return to_string(s); }

}  // namespace

// ---- public API ------------------------------------------------------------------------------

SplitSpec parse_split(const std::string& spec) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : spec) {
    if (c == ',') {
      parts.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(trim(cur));
  if (parts.size() != 3)
    throw std::invalid_argument(strf(
        "--split '%s' has %zu part(s); expected three comma-separated sizes train,val,test like "
        "90M,5M,5M or 0.9,0.05,0.05",
        spec.c_str(), parts.size()));
  static const char* names[3] = {"train", "val", "test"};
  int64_t bytes[3] = {0, 0, 0};
  double frac[3] = {0, 0, 0};
  int n_frac = 0, n_bytes = 0;  // a plain 0 goes with either kind ("0.95,0.05,0")
  for (int i = 0; i < 3; ++i) {
    if (parse_part(spec, parts[i], names[i], &bytes[i], &frac[i])) ++n_frac;
    else if (bytes[i] != 0) ++n_bytes;
  }
  SplitSpec out;
  if (n_frac > 0 && n_bytes > 0)
    throw std::invalid_argument(strf(
        "--split '%s' mixes fractions and byte counts; use either three byte counts (90M,5M,5M) "
        "or three fractions (0.9,0.05,0.05)",
        spec.c_str()));
  if (n_frac > 0) {
    double sum = frac[0] + frac[1] + frac[2];
    if (sum > 1 + 1e-9)
      throw std::invalid_argument(
          strf("--split '%s': the fractions add up to %g, more than the whole file (1)", spec.c_str(), sum));
    if (sum <= 0) throw std::invalid_argument(strf("--split '%s': the fractions are all zero", spec.c_str()));
    out.fractions = true;
    out.f_train = frac[0];
    out.f_val = frac[1];
    out.f_test = frac[2];
    out.sizes = SplitSizes{0, 0, 0};
    return out;
  }
  if (double(bytes[0]) + double(bytes[1]) + double(bytes[2]) > 9e18)
    throw std::invalid_argument(strf("--split '%s': the sizes add up to more than any file holds", spec.c_str()));
  out.sizes = SplitSizes{bytes[0], bytes[1], bytes[2]};
  if (out.sizes.total() <= 0)
    throw std::invalid_argument(strf("--split '%s': the sizes are all zero", spec.c_str()));
  return out;
}

std::string to_string(const SplitSpec& s) {
  if (s.fractions) return strf("%g,%g,%g", s.f_train, s.f_val, s.f_test);
  return human_bytes(s.sizes.train) + "," + human_bytes(s.sizes.val) + "," + human_bytes(s.sizes.test);
}

namespace detail {

std::runtime_error gzip_corrupt(const std::string& path, const std::string& why, size_t compressed_bytes) {
  return std::runtime_error(strf("data file '%s' is a truncated or corrupt gzip file (%s, %zu compressed bytes): "
                                 "download it again, check it with `gzip -t`, or %s",
                                 path.c_str(), why.c_str(), compressed_bytes, kDownloadHint));
}

void check_inflate(int rc, const char* msg, const std::string& path, size_t compressed_bytes) {
  if (rc == Z_OK || rc == Z_BUF_ERROR) return;
  if (rc == Z_NEED_DICT || rc == Z_DATA_ERROR)
    throw gzip_corrupt(path, msg ? msg : "invalid compressed data", compressed_bytes);
  if (rc == Z_MEM_ERROR) throw std::runtime_error(strf("zlib: out of memory inflating '%s'", path.c_str()));
  throw gzip_corrupt(path, strf("zlib error %d", rc), compressed_bytes);
}

SplitSizes resolve_split_sizes(const std::string& path, const SplitSpec& split, int64_t n, bool gzip,
                               int64_t min_split_bytes, const SplitNeed& need) {
  SplitSizes sz = split.sizes;
  if (split.fractions) {
    // Round each part; if rounding overshoots the file, take the overshoot from train.
    sz.train = std::llround(split.f_train * double(n));
    sz.val = std::llround(split.f_val * double(n));
    sz.test = std::llround(split.f_test * double(n));
    if (sz.total() > n) sz.train -= sz.total() - n;
  }
  if (sz.train < 0 || sz.val < 0 || sz.test < 0)
    throw std::invalid_argument(strf("split %s has a negative size", split_desc(split).c_str()));
  if (n < sz.total())
    throw std::runtime_error(strf(
        "data file '%s' holds %lld bytes%s, but the split %s needs %lld (train %lld + val %lld + "
        "test %lld): pass --split to change it (e.g. --split 0.9,0.05,0.05 for fractions of the "
        "file), or %s",
        path.c_str(), (long long)n, gzip ? " after decompression" : "", split_desc(split).c_str(),
        (long long)sz.total(), (long long)sz.train, (long long)sz.val, (long long)sz.test,
        kDownloadHint));
  const char* names[3] = {"train", "val", "test"};
  const int64_t sizes[3] = {sz.train, sz.val, sz.test};
  const bool checked[3] = {need.train, need.val, need.test};
  for (int i = 0; i < 3; ++i)
    if (checked[i] && sizes[i] < min_split_bytes)
      throw std::runtime_error(strf(
          "data file '%s': the %s split (%s of %lld bytes) has %lld bytes, fewer than the %lld "
          "bytes %s: %s",
          path.c_str(), names[i], split_desc(split).c_str(), (long long)n, (long long)sizes[i],
          (long long)min_split_bytes, need.what.c_str(), need.fix.c_str()));

  return sz;
}

}  // namespace detail

SplitNeed SplitNeed::only(const std::string& name, std::string what, std::string fix) {
  if (name != "train" && name != "val" && name != "test")
    throw std::invalid_argument("SplitNeed::only: expected train, val or test, got '" + name + "'");
  SplitNeed need;
  need.train = name == "train", need.val = name == "val", need.test = name == "test";
  need.what = std::move(what), need.fix = std::move(fix);
  return need;
}

Corpus load_corpus(const std::string& path, const SplitSpec& split, int64_t min_split_bytes, const SplitNeed& need) {
  Buffer raw;
  read_file(path, &raw);
  Corpus c;
  c.path = path;
  c.gzip = is_gzip(raw);
  if (!c.gzip && ends_with(path, ".gz")) require_gzip_magic(path, raw);
  Buffer bytes;
  if (c.gzip) {
    gunzip(path, raw, &bytes);
    raw.reset();  // free the compressed copy before building tensors
  } else {
    bytes.take(raw);
  }
  const int64_t n = static_cast<int64_t>(bytes.size);
  c.file_bytes = n;

  const SplitSizes sz = detail::resolve_split_sizes(path, split, n, c.gzip, min_split_bytes, need);

  // Bytes past the splits are kept (one allocation, no copy); the views just do not reach them.
  uint8_t* p = bytes.release();
  at::Tensor all = at::from_blob(
      p, {std::max<int64_t>(n, 0)}, [](void* q) { std::free(q); },
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
  c.train = all.narrow(0, 0, sz.train);
  c.val = all.narrow(0, sz.train, sz.val);
  c.test = all.narrow(0, sz.train + sz.val, sz.test);
  return c;
}

// ---- BatchSampler ------------------------------------------------------------------------------

namespace {

// Unbiased integer in [0, range) from the raw 64-bit output, by rejection. Written out rather than
// std::uniform_int_distribution, whose algorithm differs between standard libraries: crops must
// be the same for a seed everywhere (resume, tests).
uint64_t uniform_below(std::mt19937_64& gen, uint64_t range) {
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % range;
  for (;;) {
    uint64_t x = gen();
    if (x < limit) return x % range;
  }
}

void check_split(const at::Tensor& split, int64_t seq_len, const char* who) {
  if (!split.defined() || split.dim() != 1 || split.scalar_type() != at::kByte || !split.device().is_cpu())
    throw std::invalid_argument(strf("%s: expected a 1-D uint8 CPU tensor of corpus bytes (a split "
                                     "from load_corpus), got %s",
                                     who, split.defined() ? split.toString().c_str() : "an undefined tensor"));
  if (seq_len <= 0) throw std::invalid_argument(strf("%s: seq_len must be positive, got %lld", who, (long long)seq_len));
  if (split.numel() < seq_len + 1)
    throw std::invalid_argument(strf("%s: the split has %lld bytes, fewer than seq_len + 1 = %lld: "
                                     "use a smaller --seq-len or a larger --split",
                                     who, (long long)split.numel(), (long long)(seq_len + 1)));
}

}  // namespace

BatchSampler::BatchSampler(at::Tensor split, int64_t seq_len, int64_t batch, uint64_t seed)
    : split_(std::move(split)), seq_len_(seq_len), batch_(batch), gen_(seed) {
  check_split(split_, seq_len_, "BatchSampler");
  if (batch_ <= 0) throw std::invalid_argument(strf("BatchSampler: batch must be positive, got %lld", (long long)batch_));
  split_ = split_.contiguous();
}

at::Tensor BatchSampler::next() {
  const int64_t T1 = seq_len_ + 1;
  // A fresh tensor per batch: with pinned memory, the caching host allocator keeps it alive until
  // an async copy that reads it has finished, so the caller may copy non_blocking and move on.
  auto opts = at::TensorOptions().dtype(at::kLong).device(at::kCPU).pinned_memory(at::hasCUDA());
  at::Tensor out = at::empty({batch_, T1}, opts);
  const uint8_t* src = split_.data_ptr<uint8_t>();
  int64_t* dst = out.data_ptr<int64_t>();
  const uint64_t starts = static_cast<uint64_t>(split_.numel() - seq_len_);  // valid starts: [0, starts)
  for (int64_t b = 0; b < batch_; ++b) {
    const uint8_t* s = src + uniform_below(gen_, starts);
    int64_t* d = dst + b * T1;
    for (int64_t t = 0; t < T1; ++t) d[t] = s[t];
  }
  return out;
}

std::string BatchSampler::state() const {
  std::ostringstream os;
  os << gen_;
  return os.str();
}

void BatchSampler::load_state(const std::string& s) {
  std::istringstream is(s);
  std::mt19937_64 g;
  is >> g;
  std::string rest;
  if (is.fail() || (is >> rest, !rest.empty()))
    throw std::invalid_argument(strf(
        "BatchSampler::load_state: not a data-sampler state (expected the %zu integers of an "
        "mt19937_64 state as written by BatchSampler::state(), got %zu characters starting '%.40s'); "
        "the checkpoint's data state is corrupt or from another program",
        size_t(std::mt19937_64::state_size + 1), s.size(), s.c_str()));
  gen_ = g;
}

// ---- fixed windows / text ------------------------------------------------------------------------

at::Tensor fixed_windows(const at::Tensor& split, int64_t seq_len, int64_t max_windows) {
  check_split(split, seq_len, "fixed_windows");
  at::Tensor sp = split.contiguous();
  const int64_t T1 = seq_len + 1;
  const int64_t count = (sp.numel() - 1) / seq_len;  // window w = [w*T, w*T + T + 1) fits
  const int64_t n = (max_windows > 0 && max_windows < count) ? max_windows : count;
  at::Tensor out = at::empty({n, T1}, at::TensorOptions().dtype(at::kLong));
  const uint8_t* src = sp.data_ptr<uint8_t>();
  int64_t* dst = out.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t w = (n == count) ? k : k * count / n;  // evenly spaced, starts with window 0
    const uint8_t* s = src + w * seq_len;
    for (int64_t t = 0; t < T1; ++t) dst[k * T1 + t] = s[t];
  }
  return out;
}

std::string decode_bytes(const at::Tensor& tokens) {
  at::Tensor t = tokens.to(at::kCPU, at::kLong).contiguous().view({-1});
  return decode_byte_values(t.data_ptr<int64_t>(), t.numel());
}

at::Tensor encode_text(const std::string& text) {
  const int64_t n = static_cast<int64_t>(text.size());
  at::Tensor out = at::empty({1, n}, at::TensorOptions().dtype(at::kLong));
  int64_t* d = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string resolve_corpus_path(const std::string& path) {
  if (std::ifstream(path)) return path;
  if (std::ifstream(path + ".gz")) return path + ".gz";
  return path;
}

}  // namespace flashcos::data
