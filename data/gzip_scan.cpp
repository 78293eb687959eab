// Streaming gzip inflate keeping one byte range (gzip_scan.h). The same member / padding rules as
// corpus.cpp's gunzip, which inflates into memory instead; the errors come from the same helpers
// (corpus_detail.h) so a bad corpus reads the same whichever command met it first.
#include "data/gzip_scan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "common/log.h"
#include "data/corpus_detail.h"

namespace flashcos::data {
namespace {

using detail::kDownloadHint;

// 4 MiB in and out: a few hundred inflate calls for a 100 MB corpus, and small enough to stay in
// the last-level cache while the discarded output is overwritten.
constexpr size_t kBuf = size_t(4) << 20;

struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

int open_or_throw(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) return fd;
  const int err = errno;
  if (err == ENOENT || err == ENOTDIR)
    throw std::runtime_error(strf("data file '%s' not found: %s", path.c_str(), kDownloadHint));
  throw std::runtime_error(strf("data file '%s' is unreadable (%s): check its permissions, or %s", path.c_str(),
                                std::strerror(err), kDownloadHint));
}

// Reads until `cap` bytes or the end of the file; returns the count (0: end of file).
size_t read_fully(int fd, const std::string& path, uint8_t* p, size_t cap, int64_t done) {
  size_t got = 0;
  while (got < cap) {
    const ssize_t r = ::read(fd, p + got, cap - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw std::runtime_error(strf("data file '%s' is unreadable: read error (%s) after %lld bytes", path.c_str(),
                                    std::strerror(errno), static_cast<long long>(done + static_cast<int64_t>(got))));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace

int64_t scan_gzip(const std::string& path, int64_t from, int64_t n, uint8_t* dst) {
  FdCloser file{open_or_throw(path)};
  const int fd = file.fd;
  struct stat st {};
  const size_t compressed = ::fstat(fd, &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  auto corrupt = [&](const std::string& why) { return detail::gzip_corrupt(path, why, compressed); };
  std::unique_ptr<uint8_t[]> in(new uint8_t[kBuf]), out(new uint8_t[kBuf]);

  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK)  // 16: expect the gzip wrapper, check CRC + ISIZE
    throw std::runtime_error(strf("zlib inflateInit2 failed for '%s'", path.c_str()));
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);

  int64_t file_read = 0, out_total = 0;
  bool eof = false;
  zs.next_in = in.get();
  zs.avail_in = 0;
  // Keeps the unconsumed input, moved to the front, and fills the rest of the buffer.
  auto refill = [&] {
    if (eof) return;
    const size_t keep = zs.avail_in;
    if (keep > 0 && zs.next_in != in.get()) std::memmove(in.get(), zs.next_in, keep);
    const size_t got = read_fully(fd, path, in.get() + keep, kBuf - keep, file_read);
    if (got == 0) eof = true;
    file_read += static_cast<int64_t>(got);
    zs.next_in = in.get();
    zs.avail_in = static_cast<uInt>(keep + got);
  };
  const int64_t to = from + n;
  for (;;) {
    if (zs.avail_in == 0) refill();
    zs.next_out = out.get();
    zs.avail_out = static_cast<uInt>(kBuf);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    const int64_t produced = static_cast<int64_t>(kBuf - zs.avail_out);
    if (from >= 0) {  // the part of [from, to) in this chunk [out_total, out_total + produced)
      const int64_t lo = std::max(from, out_total), hi = std::min(to, out_total + produced);
      if (lo < hi) std::memcpy(dst + (lo - from), out.get() + (lo - out_total), static_cast<size_t>(hi - lo));
    }
    out_total += produced;
    if (rc == Z_STREAM_END) {
      // Another gzip member may follow (concatenated .gz files are valid gzip); zero padding is
      // tolerated, anything else is not ours to guess about.
      if (zs.avail_in < 2) refill();
      if (zs.avail_in == 0) break;
      if (zs.avail_in >= 2 && zs.next_in[0] == 0x1f && zs.next_in[1] == 0x8b) {
        inflateReset(&zs);
        continue;
      }
      const int64_t at = file_read - zs.avail_in;
      bool zeros = true;
      while (zeros && zs.avail_in > 0) {
        for (uInt i = 0; i < zs.avail_in && zeros; ++i) zeros = zs.next_in[i] == 0;
        zs.avail_in = 0;
        refill();
      }
      if (zeros) break;
      throw corrupt(strf("%zu bytes of unexpected data after the gzip stream at offset %zu",
                         compressed - static_cast<size_t>(at), static_cast<size_t>(at)));
    }
    detail::check_inflate(rc, zs.msg, path, compressed);
    // Z_BUF_ERROR means no progress was possible: with output room left, the input ran out.
    if (eof && zs.avail_in == 0 && zs.avail_out > 0)
      throw corrupt(strf("the stream ends early after %zu decompressed bytes", static_cast<size_t>(out_total)));
  }
  return out_total;
}

int64_t gzip_isize(const std::string& path) {
  FdCloser file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  struct stat st {};
  if (file.fd < 0 || ::fstat(file.fd, &st) != 0 || st.st_size < 18) return -1;
  uint8_t t[4];
  if (::pread(file.fd, t, 4, st.st_size - 4) != 4) return -1;
  return int64_t(t[0]) | int64_t(t[1]) << 8 | int64_t(t[2]) << 16 | int64_t(t[3]) << 24;
}

}  // namespace flashcos::data
