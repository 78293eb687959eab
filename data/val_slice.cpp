// load_val_slice (corpus.h): the sample's prime, n bytes of the val split, without loading the
// corpus. A raw file is read with one seek; a gzip file is inflated as a stream (gzip_scan.h) that
// keeps only the slice, with the split sizes known before the scan: byte-count splits do not
// depend on the file size, and fraction splits take it from the gzip ISIZE trailer, checked
// against the true size at the end of the scan (a second scan when the trailer was wrong).
#include <ATen/ATen.h>

#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>

#include "common/log.h"
#include "data/corpus.h"
#include "data/corpus_detail.h"
#include "data/gzip_scan.h"

namespace flashcos::data {
namespace {

enum class Kind { kRaw, kGzip, kOther };

using detail::ends_with;
using detail::FileCloser;

// A regular file with the gzip magic (whatever its name), a regular file without it and not named
// .gz, or anything else (missing, a pipe, a fake .gz, unreadable: load_corpus reports those).
Kind kind_of(const std::string& path, int64_t* file_bytes) {
  struct stat st {};
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  unsigned char magic[2] = {0, 0};
  if (!f || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || std::fread(magic, 1, 2, f.get()) != 2)
    return Kind::kOther;
  *file_bytes = static_cast<int64_t>(st.st_size);
  if (magic[0] == 0x1f && magic[1] == 0x8b) return Kind::kGzip;
  return ends_with(path, ".gz") ? Kind::kOther : Kind::kRaw;
}

int64_t checked_offset(const std::function<int64_t(int64_t)>& pick_offset, int64_t val, int64_t n) {
  const int64_t off = pick_offset(val);
  if (off < 0 || off + n > val) throw std::out_of_range("load_val_slice: offset outside the val split");
  return off;
}

at::Tensor gzip_slice(const std::string& path, const SplitSpec& split, int64_t n,
                      const std::function<int64_t(int64_t)>& pick_offset, const SplitNeed& need) {
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  uint8_t* dst = out.data_ptr<uint8_t>();
  // The sizes the trailer implies, if they pass the checks; the offset is picked from them.
  std::optional<SplitSizes> guess;
  try {
    const int64_t isize = gzip_isize(path);
    if (isize >= 0) guess = detail::resolve_split_sizes(path, split, isize, true, n + 1, need);
  } catch (const std::exception&) {  // the real size decides below
  }
  const int64_t from = guess ? guess->train + checked_offset(pick_offset, guess->val, n) : -1;
  const int64_t total = scan_gzip(path, from, n, dst);
  const SplitSizes sz = detail::resolve_split_sizes(path, split, total, true, n + 1, need);  // load_corpus's errors
  if (guess && guess->train == sz.train && guess->val == sz.val) return out;
  // The trailer was wrong (several members, 4 GiB or more): the offset again, from the true sizes.
  // pick_offset sees the val size it would have seen from load_corpus.
  const int64_t off = checked_offset(pick_offset, sz.val, n);
  (void)scan_gzip(path, sz.train + off, n, dst);
  return out;
}

}  // namespace

at::Tensor load_val_slice(const std::string& path, const SplitSpec& split, int64_t n,
                          const std::function<int64_t(int64_t)>& pick_offset, const SplitNeed& need) {
  int64_t file_bytes = -1;
  const Kind kind = kind_of(path, &file_bytes);
  if (kind == Kind::kGzip) return gzip_slice(path, split, n, pick_offset, need);
  if (kind == Kind::kOther) {  // a pipe or an error: load_corpus reads it (and reports the error)
    const Corpus c = load_corpus(path, split, n + 1, need);
    const int64_t off = checked_offset(pick_offset, c.val.numel(), n);
    return c.val.slice(0, off, off + n).clone();
  }
  const SplitSizes sz = detail::resolve_split_sizes(path, split, file_bytes, false, n + 1, need);
  const int64_t off = checked_offset(pick_offset, sz.val, n);
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f || ::fseeko(f.get(), static_cast<off_t>(sz.train + off), SEEK_SET) != 0 ||
      std::fread(out.data_ptr<uint8_t>(), 1, static_cast<size_t>(n), f.get()) != static_cast<size_t>(n)) {
    throw std::runtime_error(strf("data file '%s' is unreadable: could not read %lld bytes at offset %lld",
                                  path.c_str(), (long long)n, (long long)(sz.train + off)));
  }
  return out;
}

}  // namespace flashcos::data
