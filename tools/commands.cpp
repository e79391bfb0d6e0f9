// tools/commands.cpp — `blobpipe inspect` and `blobpipe verify`.
//
// Both read the footer and index with read_index_file (two reads), which
// validates every number before use; only then are entry bytes read, each
// entry's range through one buffer of at most read_chunk_bytes, so memory
// is bounded by the index, never by the blob or its largest entry.
#include "tools/commands.hpp"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "blobpipe/format.hpp"
#include "tools/layout_check.hpp"
#include "tools/stdout_status.hpp"
#include "tools/user_path.hpp"

namespace blobpipe::cli {
namespace {

using json = nlohmann::ordered_json;

// The category and message go on one line whatever the message holds, so
// scripts can rely on `blobpipe: CATEGORY: ` being the whole of stderr.
std::string one_line(std::string s) {
  std::replace_if(s.begin(), s.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return s;
}

// A file that cannot be read (errc::io) exits 3, anything the blob's bytes
// got wrong exits 2.
int fail(std::ostream& err, const error& e) {
  err << "blobpipe: " << errc_name(e.code) << ": " << one_line(e.message) << '\n';
  return e.code == errc::io ? exit_io : exit_invalid;
}

int fail_io(std::ostream& err, const std::string& what) {
  err << "blobpipe: io: " << one_line(what) << '\n';
  return exit_io;
}

// Flushes the report; when it could not be written (a full disk, a closed
// stdout), says why in the words main uses for --help (stdout_status.hpp).
// errno is the failed write's: once `out` has failed it writes nothing
// more, and formatting sets no errno.
int finish_report(std::ostream& out, std::ostream& err) {
  out.flush();
  if (!out) return fail_io(err, write_error_text(errno));
  return exit_ok;
}

// Entry bytes are read through one buffer of this many bytes.
constexpr std::size_t read_chunk_bytes = std::size_t{1} << 20;

// Reads `out.size()` bytes at absolute file offset `off`. pread leaves the
// stdio position alone.
bool read_at(std::FILE* f, std::uint64_t off, std::span<std::byte> out, std::string& why) {
  const int fd = ::fileno(f);
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done,
                        static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      why = std::string("read failed: ") + std::strerror(errno);
      return false;
    }
    if (n == 0) {
      why = "file ended after " + std::to_string(done) + " of " + std::to_string(out.size()) +
            " bytes at offset " + std::to_string(off);
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// A SHA-256 digest, kept as bytes (32 per entry) until it is printed.
using digest = std::array<unsigned char, 32>;

std::string hex(const digest& d) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * d.size());
  for (unsigned char b : d) {
    out += digits[b >> 4];
    out += digits[b & 0xf];
  }
  return out;
}

// An incremental SHA-256.
class sha256 {
 public:
  sha256() : ctx_(EVP_MD_CTX_new()) {
    // OpenSSL fails here only when it cannot allocate.
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      throw std::bad_alloc();
  }
  void update(std::span<const std::byte> b) { EVP_DigestUpdate(ctx_.get(), b.data(), b.size()); }
  digest finish() {
    digest d{};
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_.get(), d.data(), &n);
    return d;
  }

 private:
  struct free_ctx {
    void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, free_ctx> ctx_;
};

std::string shape_text(const std::optional<shape_t>& shape) {
  if (!shape) return "-";
  std::string s = "[";
  for (std::size_t i = 0; i < shape->size(); ++i) {
    if (i) s += ',';
    s += std::to_string((*shape)[i]);
  }
  return s + "]";
}

// What both commands share: the open file, its validated index, and the
// index's layout findings.
struct blob_session {
  file_ptr file;
  blob_index index;
  std::vector<finding> findings;
};

// Opens FILE and reads footer + index. Returns a nonzero exit code, having
// printed the one stderr line, on failure.
// A relative FILE is relative to where the user typed the command, also
// under `bazel run` (user_path); reports name FILE as it was typed.
int open_and_index(const options& o, std::ostream& err, blob_session& s) {
  auto file = open_blob_file(user_path(o.file));
  if (!file) return fail(err, file.err());
  s.file = std::move(*file);
  auto idx = read_index_file(s.file.get(), o.offset, o.nbytes);
  if (!idx) return fail(err, idx.err());
  s.index = std::move(*idx);
  s.findings = check_layout(s.index);
  return exit_ok;
}

// Reads entry `e` through `buf` (at most read_chunk_bytes), handing each
// piece to `take` in order.
template <class Take>
int read_entry(const options& o, const blob_session& s, const Entry& e,
               std::vector<std::byte>& buf, std::ostream& err, Take take) {
  buf.resize(static_cast<std::size_t>(std::min<std::uint64_t>(e.len, read_chunk_bytes)));
  std::string why;
  for (std::uint64_t done = 0; done < e.len;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(e.len - done, buf.size()));
    const std::span<std::byte> piece(buf.data(), n);
    if (!read_at(s.file.get(), o.offset + e.off + done, piece, why))
      return fail_io(err, quote(o.file, SIZE_MAX) + ": " + why);
    take(std::span<const std::byte>(piece));
    done += n;
  }
  return exit_ok;
}

json entry_json(const Entry& e, const digest* d) {
  json j;
  j["key"] = e.key;
  j["off"] = e.off;
  j["len"] = e.len;
  j["kind"] = std::string(1, e.kind);
  j["dtype"] = e.dtype ? json(*e.dtype) : json(nullptr);
  j["shape"] = e.shape ? json(*e.shape) : json(nullptr);
  if (d) j["sha256"] = hex(*d);
  return j;
}

json findings_json(const std::vector<finding>& findings) {
  json list = json::array();
  for (const finding& f : findings) {
    json j;
    j["kind"] = f.kind;
    j["category"] = errc_name(f.code);
    j["count"] = f.count;
    j["message"] = f.message;
    list.push_back(std::move(j));
  }
  return list;
}

// ASCII only: every control character and every non-ASCII one is a \u
// escape, so the report cannot act on a terminal; parsers read the same
// strings back.
std::string dump(const json& j) { return j.dump(-1, ' ', true, json::error_handler_t::replace); }

// One JSON object, written an entry at a time: no document of millions of
// rows is built (its nodes would cost more than the entries).
void print_json(const blob_session& s, const std::vector<digest>& digests, std::ostream& out) {
  const blob_index& idx = s.index;
  out << "{\"footer_version\":" << idx.foot.version
      << ",\"tag_hex\":" << dump(tag_hex(idx.foot.tag))
      << ",\"index_off\":" << idx.foot.index_off << ",\"index_len\":" << idx.foot.index_len
      << ",\"nbytes\":" << idx.nbytes << ",\"entries\":[";
  for (std::size_t i = 0; i < idx.entries.size(); ++i) {
    if (i) out << ',';
    out << dump(entry_json(idx.entries[i], digests.empty() ? nullptr : &digests[i]));
  }
  out << "],\"findings\":" << dump(findings_json(s.findings)) << "}\n";
}

// The cells of one text row: the header row when `i` is npos.
std::vector<std::string> text_row(const blob_session& s, const std::vector<digest>& digests,
                                  std::size_t i) {
  std::vector<std::string> r;
  if (i == std::string::npos) {
    r = {"#", "off", "len", "kind", "dtype", "shape"};
    if (!digests.empty()) r.push_back("sha256");
    r.push_back("key");
    return r;
  }
  const Entry& e = s.index.entries.at(i);  // a row past the index is a bug: thrown, not read
  r = {std::to_string(i), std::to_string(e.off), std::to_string(e.len), std::string(1, e.kind),
       e.dtype ? *e.dtype : "-", shape_text(e.shape)};
  if (!digests.empty()) r.push_back(hex(digests[i]));
  r.push_back(quote(e.key, SIZE_MAX));  // keys may hold anything: escaped
  return r;
}

void print_text(const blob_session& s, const std::vector<digest>& digests, std::ostream& out) {
  const blob_index& idx = s.index;
  out << "footer_version  " << idx.foot.version << '\n'
      << "tag_hex         " << tag_hex(idx.foot.tag) << '\n'
      << "index_off       " << idx.foot.index_off << '\n'
      << "index_len       " << idx.foot.index_len << '\n'
      << "nbytes          " << idx.nbytes << '\n'
      << "entries         " << idx.entries.size() << '\n';
  for (const finding& f : s.findings)
    out << "finding         " << f.kind << " (" << f.count << "): " << f.message << '\n';
  if (idx.entries.empty()) return;

  // Columns are padded to their widest cell; the key goes last because it
  // is the only unbounded one. Two passes over the rows (widths, then
  // lines), so no table of millions of rows is held.
  const std::size_t header = std::string::npos;
  std::vector<std::size_t> width(text_row(s, digests, header).size(), 0);
  auto widen = [&](const std::vector<std::string>& r) {
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  };
  auto print = [&](const std::vector<std::string>& r) {
    std::string line;
    for (std::size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line.append(width[c] - r[c].size() + 2, ' ');
    }
    out << line << '\n';
  };
  widen(text_row(s, digests, header));
  for (std::size_t i = 0; i < idx.entries.size(); ++i) widen(text_row(s, digests, i));
  print(text_row(s, digests, header));
  for (std::size_t i = 0; i < idx.entries.size(); ++i) print(text_row(s, digests, i));
}

}  // namespace

int run_inspect(const options& o, std::ostream& out, std::ostream& err) {
  blob_session s;
  if (int rc = open_and_index(o, err, s)) return rc;

  // Every digest before any output, so a read error leaves no half report.
  std::vector<digest> digests;
  if (o.digest) {
    // Rows whose bytes overlap would have their bytes read once per row
    // (a sparse file whose many rows each cover it whole hashed for hours);
    // without overlap the digests read at most the blob once. The reference
    // never writes overlapping entries.
    for (const finding& f : s.findings)
      if (f.kind == "entries_overlap")
        return fail(err, make_error(f.code, "--digest: " + f.kind + ": " + f.message +
                                                " (digests are taken only of entries that "
                                                "do not overlap; inspect without --digest "
                                                "lists them)"));
    std::vector<std::byte> buf;
    digests.reserve(s.index.entries.size());
    for (const Entry& e : s.index.entries) {
      sha256 h;
      if (int rc = read_entry(o, s, e, buf, err, [&](auto piece) { h.update(piece); })) return rc;
      digests.push_back(h.finish());
    }
  }
  errno = 0;  // finish_report reads the reason of a failed write here
  if (o.json) {
    print_json(s, digests, out);
  } else {
    print_text(s, digests, out);
  }
  return finish_report(out, err);
}

int run_verify(const options& o, std::ostream& out, std::ostream& err) {
  blob_session s;
  if (int rc = open_and_index(o, err, s)) return rc;
  // A layout the reference never writes is refused before any entry is
  // read: the first finding, and how many kinds there were.
  if (!s.findings.empty()) {
    const finding& f = s.findings.front();
    std::string message = f.kind + ": " + f.message;
    if (s.findings.size() > 1)
      message += " (and " + std::to_string(s.findings.size() - 1) + " more kind(s) of finding)";
    return fail(err, make_error(f.code, message));
  }
  // Every entry's bytes are read, through one bounded buffer; parse_index
  // has checked each row's range, dtype and shape x itemsize == len.
  std::uint64_t data_bytes = 0;
  std::vector<std::byte> buf;
  for (const Entry& e : s.index.entries) {
    if (int rc = read_entry(o, s, e, buf, err, [](auto) {})) return rc;
    data_bytes += e.len;
  }
  errno = 0;  // finish_report reads the reason of a failed write here
  out << o.file << ": ok: " << s.index.entries.size() << " entries, " << data_bytes
      << " data bytes, blob " << s.index.nbytes << " bytes, footer v"
      << s.index.foot.version << ", tag " << tag_hex(s.index.foot.tag) << '\n';
  return finish_report(out, err);
}

}  // namespace blobpipe::cli
