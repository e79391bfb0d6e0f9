// test/wire_vectors.hpp — the wire protocol's test vectors (docs/wire.md
// "Test vectors"): byte streams a sender may put on a connection, built
// with the framer, and the text of what a version-3 consumer decodes from
// each with the push decoder. test/wire_vectors_gen.cpp writes them to
// test/wire_vectors/; //test:wire_vectors_test checks the files against
// both.
#pragma once

#include <array>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <openssl/evp.h>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/protocol/framer.hpp"

namespace blobpipe::testing {

struct wire_vector {
  std::string name;              ///< file name, "*.bin"
  std::vector<std::byte> bytes;  ///< the stream, the sender's hello first
};

inline std::string hex(std::span<const std::byte> b) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (std::byte x : b) {
    out += digits[std::to_integer<unsigned>(x) >> 4];
    out += digits[std::to_integer<unsigned>(x) & 15];
  }
  return out;
}

inline std::string sha256_hex(std::span<const std::byte> b) {
  std::array<std::byte, 32> d{};
  unsigned n = 0;
  EVP_Digest(b.data(), b.size(), reinterpret_cast<unsigned char*>(d.data()), &n, EVP_sha256(),
             nullptr);
  return hex(d);
}

/// What the decoder reports, one line per event (docs/wire.md "Test vectors").
class vector_listener final : public decoder_listener {
 public:
  decoder* dec = nullptr;
  std::vector<std::string> lines;

  result<void> on_hello(const hello& h) override {
    lines.push_back("hello role=" + std::string(h.role == wire_role::sender ? "sender" : "consumer") +
                    " version=" + std::to_string(h.version) +
                    " max_chunk_bytes=" + std::to_string(h.max_chunk_bytes) +
                    " inline_bytes=" + std::to_string(h.inline_bytes) +
                    " features=" + std::to_string(h.features) + " session=" + hex(h.session) +
                    " extensions=" + std::to_string(h.extensions.size()));
    // The consumer's defaults: chunk and inline as offered, and the
    // features a consumer accepts by default (consumer_options).
    auto l = dec->limits();
    l.max_chunk_bytes = std::min(l.max_chunk_bytes, h.max_chunk_bytes);
    l.inline_bytes = std::min(l.inline_bytes, h.inline_bytes);
    l.features = h.features & (feature_blob_groups | feature_compact_entries);
    dec->set_limits(l);
    return {};
  }
  result<void*> on_blob_begin(std::uint64_t id, const tag_t& tag) override {
    lines.push_back("blob_begin id=" + std::to_string(id) + " tag=" + hex(tag));
    return static_cast<void*>(nullptr);
  }
  result<std::span<std::byte>> on_entry_begin(void*, const entry_announcement& a) override {
    const Entry& e = *a.entry;
    std::string shape = "nil";
    if (e.shape) {
      shape = "[";
      for (std::size_t i = 0; i < e.shape->size(); ++i)
        shape += (i ? "," : "") + std::to_string((*e.shape)[i]);
      shape += "]";
    }
    lines.push_back("entry_begin id=" + std::to_string(a.blob_id) + " index=" +
                    std::to_string(a.index) + " key=" + quote(e.key) + " off=" +
                    std::to_string(e.off) + " len=" + std::to_string(e.len) + " kind=" + e.kind +
                    " dtype=" + e.dtype.value_or("nil") + " shape=" + shape +
                    " credit=" + std::to_string(a.credit));
    bytes_.assign(e.len, std::byte{0});
    credit_ = a.credit;
    return std::span<std::byte>(bytes_);
  }
  result<void> on_entry_complete(void*, std::uint64_t id) override {
    lines.push_back("entry_complete id=" + std::to_string(id) + " sha256=" + sha256_hex(bytes_));
    dec->release(credit_);
    return {};
  }
  result<void> on_blob_complete(void*, std::uint64_t id, blob_index index,
                                std::span<const std::byte>) override {
    lines.push_back("blob_complete id=" + std::to_string(id) +
                    " rows=" + std::to_string(index.entries.size()) +
                    " nbytes=" + std::to_string(index.nbytes));
    return {};
  }
  result<void> on_blob_abort(void*, std::uint64_t id, std::string_view reason) override {
    lines.push_back("blob_abort id=" + std::to_string(id) + " reason=" + quote(reason, 4096));
    return {};
  }
  result<void> on_close(std::string_view reason) override {
    lines.push_back("close reason=" + quote(reason, 4096));
    return {};
  }

 private:
  std::vector<std::byte> bytes_;
  std::uint64_t credit_ = 0;
};

/// Decodes `stream` with default consumer limits, `piece` bytes at a time
/// (0: all at once): the event lines, then "error <category>" if it failed.
inline std::vector<std::string> decode_vector(std::span<const std::byte> stream,
                                              std::size_t piece = 0) {
  vector_listener l;
  decoder d(wire_role::sender, {}, l);
  l.dec = &d;
  result<void> r;
  for (std::size_t at = 0; at < stream.size() && r;) {
    const std::size_t n = piece ? std::min(piece, stream.size() - at) : stream.size();
    r = d.consume(stream.subspan(at, n));
    at += n;
  }
  if (!r) l.lines.push_back(std::string("error ") + errc_name(r.code()));
  return l.lines;
}

namespace vectors_detail {

inline std::vector<std::byte> bytes_of(const outbox& o) {
  std::vector<std::byte> out;
  for (const auto& p : o.pieces()) {
    const auto b = p.bytes(o);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

inline tag_t tag_of(const char* text) { return make_tag(std::string_view(text)).value(); }

/// Frames one entry of `v`: inline when 0 < len <= `inline_max`, else data
/// frames of `chunk` bytes.
inline void entry(outbox& o, layout_builder& b, std::uint64_t id, std::string key, value v,
                  std::uint64_t inline_max, std::uint32_t chunk) {
  const planned_entry& pe = *b.add(std::move(key), std::move(v)).value();
  const auto meta = pe.entry.meta();
  const std::uint64_t index = b.size() - 1;
  if (pe.entry.len != 0 && pe.entry.len <= inline_max) {
    auto room = frame_entry_begin_inline(o, id, index, pe.entry, meta);
    (void)write_entry(pe, room);
    return;
  }
  frame_entry_begin(o, id, index, pe.entry, meta);
  frame_data(o, id, pe.entry.off, std::span(pe.source.data, pe.entry.len), chunk, true);
}

/// As entry(), in the compact form (docs/wire.md "Compact entries") when
/// the row has a dtype code, else in the msgpack form: what a sender does
/// on a connection with feature_compact_entries.
inline void compact_entry(outbox& o, layout_builder& b, std::uint64_t id, std::string key,
                          value v, std::uint64_t inline_max, std::uint32_t chunk) {
  const planned_entry& pe = *b.add(std::move(key), std::move(v)).value();
  const auto code = compact_code(pe.entry, default_max_meta_bytes);
  const std::uint64_t index = b.size() - 1;
  const auto meta = code ? std::vector<std::byte>{} : pe.entry.meta();
  if (pe.entry.len != 0 && pe.entry.len <= inline_max) {
    auto room = code ? frame_entry_begin_compact_inline(o, id, index, pe.entry, *code)
                     : frame_entry_begin_inline(o, id, index, pe.entry, meta);
    (void)write_entry(pe, room);
    return;
  }
  if (code) {
    frame_entry_begin_compact(o, id, index, pe.entry, *code);
  } else {
    frame_entry_begin(o, id, index, pe.entry, meta);
  }
  frame_data(o, id, pe.entry.off, std::span(pe.source.data, pe.entry.len), chunk, true);
}

/// A hand-built entry_begin (entry `index` of blob `id`) with `flags` and `payload`.
inline void raw_entry_begin(outbox& o, std::uint64_t id, std::uint64_t index, std::uint8_t flags,
                            std::span<const std::byte> payload) {
  auto room = o.append(frame_header_size + payload.size());
  encode_frame_header({.type = frame_type::entry_begin, .flags = flags,
                       .length = static_cast<std::uint32_t>(payload.size()), .blob_id = id,
                       .arg = index},
                      room);
  std::memcpy(room.data() + frame_header_size, payload.data(), payload.size());
}

inline void tail(outbox& o, layout_builder& b, std::uint64_t id, const tag_t& tag) {
  auto plan = b.finish(tag).value();
  std::vector<std::byte> t(tail_size(plan));
  (void)write_tail(plan, t);
  frame_tail(o, id, t);
}

}  // namespace vectors_detail

/// The vectors, built with the framer.
inline std::vector<wire_vector> build_vectors() {
  using namespace vectors_detail;
  static const std::vector<float> f4 = {1.5f, -2.0f, 3.25f, 0.0f};
  static const std::vector<std::uint8_t> u300 = [] {
    std::vector<std::uint8_t> v(300);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint8_t>(i * 7);
    return v;
  }();
  static const std::vector<std::int64_t> none;
  static const std::string pickled = "\x80\x05K*.";  // pickle.dumps(42)
  const hello sender_hello{.role = wire_role::sender, .max_chunk_bytes = 128, .inline_bytes = 64};
  std::vector<wire_vector> out;

  {  // The sender's hello alone.
    outbox o;
    frame_hello(o, sender_hello);
    out.push_back({"hello.bin", bytes_of(o)});
  }
  {  // One blob: an inline entry, one in data frames, an empty one, a pickle; tail; close.
    outbox o;
    frame_hello(o, sender_hello);
    const tag_t tag = tag_of("one blob");
    frame_blob_begin(o, 1, tag);
    layout_builder b;
    entry(o, b, 1, "x", value::tensor(f4, {2, 2}), 64, 128);
    entry(o, b, 1, "big", value::ndarray_bytes(std::as_bytes(std::span(u300)), "|u1", {300}), 64,
          128);
    entry(o, b, 1, "empty", value::tensor(none, {0}), 64, 128);
    entry(o, b, 1, "meta", value::pickle(std::as_bytes(std::span(pickled))), 64, 128);
    tail(o, b, 1, tag);
    frame_close(o, "done");
    out.push_back({"one_blob.bin", bytes_of(o)});
  }
  {  // Two blobs interleaved; the second is aborted by its producer.
    outbox o;
    frame_hello(o, sender_hello);
    const tag_t t1 = tag_of("first"), t2 = tag_of("second");
    frame_blob_begin(o, 1, t1);
    frame_blob_begin(o, 2, t2);
    layout_builder b1, b2;
    entry(o, b1, 1, "a", value::tensor(f4), 64, 128);
    entry(o, b2, 2, "a", value::ndarray_bytes(std::as_bytes(std::span(u300)), "|u1", {300}), 64, 128);
    frame_blob_abort(o, 2, "producer gave up");
    tail(o, b1, 1, t1);
    frame_close(o, "");
    out.push_back({"interleaved_abort.bin", bytes_of(o)});
  }
  {  // A version-2 peer: refused by its version, before its size.
    outbox o;
    auto v2 = encode_hello(sender_hello);
    v2[4] = std::byte{2};
    v2.resize(48);
    auto room = o.append(frame_header_size + v2.size());
    encode_frame_header({.type = frame_type::hello, .length = 48}, room);
    std::memcpy(room.data() + frame_header_size, v2.data(), v2.size());
    out.push_back({"v2_hello.bin", bytes_of(o)});
  }
  {  // A tail whose index disagrees with the entries announced (another key).
    outbox o;
    frame_hello(o, sender_hello);
    const tag_t tag = tag_of("lying tail");
    frame_blob_begin(o, 1, tag);
    layout_builder b, other;
    entry(o, b, 1, "x", value::tensor(f4), 64, 128);
    (void)other.add("y", value::tensor(f4)).value();
    tail(o, other, 1, tag);
    out.push_back({"tail_mismatch.bin", bytes_of(o)});
  }
  {  // A data frame running past its entry.
    outbox o;
    frame_hello(o, sender_hello);
    frame_blob_begin(o, 1, tag_of("past"));
    layout_builder b;
    const planned_entry& pe = *b.add("x", value::tensor(f4)).value();
    frame_entry_begin(o, 1, 0, pe.entry, pe.entry.meta());
    const std::array<std::byte, 32> too_many{};
    frame_data(o, 1, 0, too_many, 128, true);
    out.push_back({"data_past_entry.bin", bytes_of(o)});
  }
  {  // An inline entry with fewer bytes than its meta announces.
    outbox o;
    frame_hello(o, sender_hello);
    frame_blob_begin(o, 1, tag_of("short"));
    layout_builder b;
    const planned_entry& pe = *b.add("x", value::tensor(f4)).value();
    const auto meta = pe.entry.meta();
    const auto payload = encode_entry_begin(pe.entry.key, meta, std::as_bytes(std::span(f4)).first(8));
    auto room = o.append(frame_header_size + payload.size());
    encode_frame_header({.type = frame_type::entry_begin, .flags = frame_flag_inline,
                         .length = static_cast<std::uint32_t>(payload.size()), .blob_id = 1},
                        room);
    std::memcpy(room.data() + frame_header_size, payload.data(), payload.size());
    out.push_back({"inline_short.bin", bytes_of(o)});
  }
  const hello compact_hello{.role = wire_role::sender, .max_chunk_bytes = 128,
                            .features = feature_compact_entries, .inline_bytes = 64};
  {  // Compact entries (feature bit 4): inline, in data frames, empty, a
     // pickle, 5 dims, and a dtype without a code in the msgpack form on the
     // same connection; tail; close.
    static const std::vector<std::uint8_t> v8(8, 0x5a);
    outbox o;
    frame_hello(o, compact_hello);
    const tag_t tag = tag_of("compact");
    frame_blob_begin(o, 1, tag);
    layout_builder b;
    compact_entry(o, b, 1, "x", value::tensor(f4, {2, 2}), 64, 128);
    compact_entry(o, b, 1, "big", value::ndarray_bytes(std::as_bytes(std::span(u300)), "|u1",
                                                       {300}), 64, 128);
    compact_entry(o, b, 1, "empty", value::tensor(none, {0}), 64, 128);
    compact_entry(o, b, 1, "meta", value::pickle(std::as_bytes(std::span(pickled))), 64, 128);
    compact_entry(o, b, 1, "five", value::ndarray_bytes(std::as_bytes(std::span(u300)).first(16),
                                                        ">i2", {2, 1, 2, 1, 2}), 64, 128);
    compact_entry(o, b, 1, "rec", value::ndarray_bytes(std::as_bytes(std::span(v8)), "|V4", {2}),
                  64, 128);
    tail(o, b, 1, tag);
    frame_close(o, "done");
    out.push_back({"compact_blob.bin", bytes_of(o)});
  }
  {  // The compact flag on a connection that did not negotiate it.
    outbox o;
    frame_hello(o, sender_hello);
    frame_blob_begin(o, 1, tag_of("not negotiated"));
    layout_builder b;
    compact_entry(o, b, 1, "x", value::tensor(f4, {2, 2}), 64, 128);
    out.push_back({"compact_not_negotiated.bin", bytes_of(o)});
  }
  {  // A reserved dtype code (30).
    outbox o;
    frame_hello(o, compact_hello);
    frame_blob_begin(o, 1, tag_of("reserved code"));
    const std::vector<std::int64_t> dims{4};
    const auto payload = encode_compact_entry_begin("x", 't', 30, 16, dims);
    raw_entry_begin(o, 1, 0, frame_flag_compact, payload);
    out.push_back({"compact_reserved_code.bin", bytes_of(o)});
  }
  {  // A stray client: fewer bytes than a frame header, refused on the first.
    const std::string_view http = "GET / HTTP/1.0\r\n\r\n";
    const auto* p = reinterpret_cast<const std::byte*>(http.data());
    out.push_back({"stray_client.bin", std::vector<std::byte>(p, p + http.size())});
  }
  return out;
}

}  // namespace blobpipe::testing
