// The compact entry_begin (feature_compact_entries, docs/wire.md "Compact
// entries"), sans I/O: the dtype table, the codec, the credit both sides
// charge, the push decoder's checks of the form (each refusal asserted by
// the field its message names), and the sender session choosing the form
// exactly when it was negotiated and the entry's dtype has a code.
#define BOOST_TEST_MODULE compact_entries_test
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "blobpipe/format/dtype.hpp"
#include "blobpipe/format/index.hpp"
#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "blobpipe/protocol/sender_session.hpp"
#include "blobpipe/protocol/wire.hpp"

using namespace blobpipe;

namespace {

std::vector<std::byte> flatten(const outbox& out) {
  std::vector<std::byte> v;
  for (const auto& p : out.pieces()) {
    const auto b = p.bytes(out);
    v.insert(v.end(), b.begin(), b.end());
  }
  return v;
}

tag_t tag_of(std::uint8_t b) {
  tag_t t{};
  t.fill(std::byte{b});
  return t;
}

/// Records what a decoder announces; negotiates `accept` & the offer.
struct recorder final : decoder_listener {
  decoder* dec = nullptr;
  std::uint64_t accept = known_features;
  std::vector<Entry> rows;
  std::vector<std::uint64_t> credits;
  std::vector<const dtype*> types;  // entry_announcement::type
  std::vector<std::vector<std::byte>> bytes;
  int completed = 0;

  result<void> on_hello(const hello& h) override {
    auto l = dec->limits();
    l.features = h.features & accept;
    dec->set_limits(l);
    return {};
  }
  result<std::span<std::byte>> on_entry_begin(void*, const entry_announcement& a) override {
    rows.push_back(*a.entry);
    credits.push_back(a.credit);
    types.push_back(a.type);
    bytes.emplace_back(a.entry->len);
    return std::span<std::byte>(bytes.back());
  }
  result<void> on_blob_complete(void*, std::uint64_t, blob_index,
                                std::span<const std::byte>) override {
    ++completed;
    return {};
  }
};

/// A consumer's decoder after the hello (features offered: `offer`) and
/// blob_begin of blob 1.
struct consumer_side {
  recorder l;
  decoder d;
  explicit consumer_side(std::uint64_t offer = known_features, decoder_limits lim = {},
                         bool begin_blob = true)
      : d(wire_role::sender, lim, l) {
    l.dec = &d;
    outbox out;
    frame_hello(out, hello{.role = wire_role::sender, .features = offer});
    if (begin_blob) frame_blob_begin(out, 1, tag_of(1));
    BOOST_TEST_REQUIRE(d.consume(flatten(out)).has_value());
  }
  /// An entry_begin of blob 1, index 0, with `flags` and `payload`.
  result<void> entry_begin(std::uint8_t flags, const std::vector<std::byte>& payload) {
    std::array<std::byte, frame_header_size> head;
    encode_frame_header({.type = frame_type::entry_begin, .flags = flags,
                         .length = static_cast<std::uint32_t>(payload.size()), .blob_id = 1},
                        head);
    std::vector<std::byte> all(head.begin(), head.end());
    all.insert(all.end(), payload.begin(), payload.end());
    return d.consume(all);
  }
};

/// The refusal's message contains `what` (and it is a protocol_violation).
bool refused_naming(const result<void>& r, const std::string& what) {
  if (r) return false;
  BOOST_TEST_MESSAGE(r.message());
  return r.code() == errc::protocol_violation && r.message().find(what) != std::string::npos;
}

std::vector<std::byte> le64(std::int64_t v) {
  std::vector<std::byte> b(8);
  std::memcpy(b.data(), &v, 8);
  return b;
}

const std::vector<std::int64_t> two_by_three{2, 3};

/// A valid compact float32 [2, 3] entry of 24 bytes, key "x", inline.
std::vector<std::byte> float32_2x3(std::span<const std::byte> data) {
  return encode_compact_entry_begin("x", 't', compact_dtype_code('t', "float32"), 24,
                                    two_by_three, data);
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_dtype_table_names_dtypes_that_parse_as_spelled) {
  int assigned = 0;
  for (int code = 0; code < 256; ++code) {
    const compact_dtype* d = compact_dtype_of(static_cast<std::uint8_t>(code));
    const bool expect = (code >= 1 && code <= 25) || (code >= 64 && code <= 88);
    BOOST_TEST((d != nullptr) == expect, "code " << code);
    if (!d) continue;
    ++assigned;
    BOOST_TEST(d->code == code);
    BOOST_TEST(d->kind == (code < 64 ? 't' : 'n'));
    auto parsed = parse_dtype(d->kind, d->name);
    BOOST_TEST_REQUIRE(parsed.has_value(), d->name);
    BOOST_TEST(parsed->name == d->name);  // the canonical spelling: the row is unchanged
    BOOST_TEST((format_dtype_of(*d) == *parsed), d->name);  // the decoder's dtype of the code
    BOOST_TEST(compact_dtype_code(d->kind, d->name) == code);
  }
  BOOST_TEST(assigned == 50);
  BOOST_TEST(compact_dtype_code('t', "float32") == 1);
  BOOST_TEST(compact_dtype_code('n', "|b1") == 64);
  BOOST_TEST(compact_dtype_code('n', "<f4") == 74);
  BOOST_TEST(compact_dtype_code('n', ">c16") == 88);
  // Aliases and other spellings have no code: the row would change.
  BOOST_TEST(compact_dtype_code('t', "float") == 0);
  BOOST_TEST(compact_dtype_code('t', "torch.float32") == 0);
  BOOST_TEST(compact_dtype_code('n', "=f4") == 0);
  BOOST_TEST(compact_dtype_code('n', "<M8[ns]") == 0);
  BOOST_TEST(compact_dtype_code('n', "float32") == 0);  // a torch name under kind n
  BOOST_TEST(compact_dtype_code('t', "<f4") == 0);
  BOOST_TEST(compact_dtype_code('p', "float32") == 0);
}

BOOST_AUTO_TEST_CASE(the_credit_counts_len_key_fixed_fields_dims_and_overhead) {
  BOOST_TEST(compact_meta_bytes(0) == 12u);
  BOOST_TEST(compact_meta_bytes(3) == 36u);
  BOOST_TEST(compact_entry_credit(1000, 5, 2) == 1000u + 5 + 12 + 16 + entry_overhead_bytes);
  BOOST_TEST(compact_dims_fit(64, 4096));
  BOOST_TEST(!compact_dims_fit(65, 1 << 20));
  BOOST_TEST(compact_dims_fit(11, 100));   // 12 + 88
  BOOST_TEST(!compact_dims_fit(12, 100));  // 12 + 96
  BOOST_TEST(!compact_dims_fit(0, 11));
}

BOOST_AUTO_TEST_CASE(the_codec_round_trips_and_lays_fields_out_as_documented) {
  const std::vector<std::byte> data(24, std::byte{7});
  const auto p = float32_2x3(data);
  BOOST_TEST_REQUIRE(p.size() == 16u + 16 + 1 + 24);
  BOOST_TEST(std::to_integer<int>(p[0]) == 1);    // key_len
  BOOST_TEST(std::to_integer<int>(p[4]) == 't');  // kind
  BOOST_TEST(std::to_integer<int>(p[5]) == 1);    // float32
  BOOST_TEST(std::to_integer<int>(p[6]) == 2);    // ndim
  BOOST_TEST(std::to_integer<int>(p[8]) == 24);   // len
  BOOST_TEST(std::to_integer<int>(p[16]) == 2);   // dims
  BOOST_TEST(std::to_integer<int>(p[24]) == 3);
  BOOST_TEST(std::to_integer<int>(p[32]) == 'x');  // key
  auto v = decode_compact_entry_begin(p, true, 64, 4096);
  BOOST_TEST_REQUIRE(v.has_value(), v.message());
  BOOST_TEST(v->key == "x");
  BOOST_TEST(v->kind == 't');
  BOOST_TEST(v->dtype->name == "float32");
  BOOST_TEST(v->len == 24u);
  BOOST_TEST(v->ndim == 2);
  BOOST_TEST(v->dim(1) == 3);
  BOOST_TEST(v->inline_bytes.size() == 24u);
}

// The consumer's row from either form is the same Entry, and a blob sent
// compact completes against its tail (the rows' digest is unchanged).
BOOST_AUTO_TEST_CASE(decoded_compact_rows_equal_the_msgpack_forms_rows) {
  std::vector<float> f(24, 1.5f);                       // float32 [2, 3, 4]
  std::vector<std::int64_t> big(32, 9);                 // >i8, 5 dims (beyond the inline 4)
  std::vector<std::byte> pick(10, std::byte{0x80});      // a pickle
  std::vector<std::byte> rec(6, std::byte{1});           // |V2: no code, msgpack form
  std::vector<float> scalar{2.0f};                       // 0-d
  layout_builder lb;
  lb.reserve(5);  // the pointers add() returns stay valid
  std::vector<const planned_entry*> pes;
  pes.push_back(*lb.add("f", value::tensor(f, shape_t{2, 3, 4})));
  pes.push_back(*lb.add("big", value::ndarray_bytes(std::as_bytes(std::span(big)), ">i8",
                                                    shape_t{1, 2, 2, 2, 4})));
  pes.push_back(*lb.add("p", value::pickle(pick)));
  pes.push_back(*lb.add("v", value::ndarray_bytes(rec, "|V2", shape_t{3})));
  pes.push_back(*lb.add("s", value::scalar(scalar[0])));
  auto plan = lb.finish(tag_of(1));
  BOOST_TEST_REQUIRE(plan.has_value());
  std::vector<std::byte> tail(tail_size(*plan));
  BOOST_TEST_REQUIRE(write_tail(*plan, tail).has_value());

  const auto send = [&](std::uint64_t accept) {
    consumer_side c(accept, {}, /*begin_blob=*/false);
    sender_session s;
    outbox out;
    // Entries above 16 bytes go in data frames.
    s.connect(sender_limits{.inline_bytes = 16, .features = accept}, &out);
    sender_blob b(tag_of(1));
    int compact_frames = 0;
    // The entries' bytes: data frames point at them until `out` is read.
    std::vector<std::vector<std::byte>> held;
    held.reserve(pes.size());
    for (const planned_entry* pe : pes) {
      auto ok = s.check_emit(b, pe->entry.key.size(), pe->entry.len);
      BOOST_TEST_REQUIRE(ok.has_value(), ok.message());
      std::vector<std::byte> meta;
      if (s.needs_meta(b, pe->entry)) pe->entry.append_meta(meta);
      auto credit = s.plan_entry(b, pe->entry, meta);
      BOOST_TEST_REQUIRE(credit.has_value());
      BOOST_TEST(s.take_credit(*credit));
      if (s.compact_code_for(pe->entry)) ++compact_frames;
      auto room = s.add_entry(b, pe->entry, meta, 0, entry_route::automatic);
      std::vector<std::byte>& bytes = held.emplace_back(pe->entry.len);
      BOOST_TEST_REQUIRE(write_entry(*pe, bytes).has_value());
      if (!room.empty()) std::memcpy(room.data(), bytes.data(), bytes.size());
      else for (std::size_t at = 0; at < bytes.size();) at += s.add_chunk(b, std::span(bytes).subspan(at));
      BOOST_TEST(s.entry_sent(b));
    }
    BOOST_TEST_REQUIRE(s.finish(b, tail).has_value());
    auto r = c.d.consume(flatten(out));
    BOOST_TEST_REQUIRE(r.has_value(), r.message());
    BOOST_TEST(c.l.completed == 1);
    // The consumer charged what the sender took (the tail's credit was
    // not taken here, and the decoder released it once checked).
    BOOST_TEST(c.d.buffered_bytes() == s.in_flight());
    return std::pair{c.l.rows, compact_frames};
  };
  const auto [compact_rows, compact_n] = send(known_features);
  const auto [plain_rows, plain_n] = send(0);
  BOOST_TEST(compact_n == 4);  // all but the |V2 entry
  BOOST_TEST(plain_n == 0);
  BOOST_TEST_REQUIRE(compact_rows.size() == pes.size());
  for (std::size_t i = 0; i < pes.size(); ++i)
    BOOST_TEST((compact_rows[i] == plain_rows[i]), "row " << i);
  BOOST_TEST((compact_rows[0].shape == shape_t{2, 3, 4}));
  BOOST_TEST((compact_rows[1].shape == shape_t{1, 2, 2, 2, 4}));
  BOOST_TEST(!compact_rows[2].dtype.has_value());
  BOOST_TEST(!compact_rows[2].shape.has_value());
  BOOST_TEST((compact_rows[4].shape == shape_t{}));
}

BOOST_AUTO_TEST_CASE(a_compact_entry_is_charged_compact_entry_credit_at_the_consumer) {
  consumer_side c;
  const std::vector<std::byte> data(24, std::byte{7});
  BOOST_TEST_REQUIRE(c.entry_begin(frame_flag_compact | frame_flag_inline, float32_2x3(data))
                         .has_value());
  BOOST_TEST_REQUIRE(c.l.credits.size() == 1u);
  BOOST_TEST(c.l.credits[0] == compact_entry_credit(24, 1, 2));
  BOOST_TEST(c.d.buffered_bytes() == compact_entry_credit(24, 1, 2));
  BOOST_TEST(c.l.rows[0].off == 0u);
  BOOST_TEST((c.l.bytes[0] == data));
}

BOOST_AUTO_TEST_CASE(the_compact_flag_needs_the_feature) {
  consumer_side c(known_features & ~feature_compact_entries);
  const std::vector<std::byte> data(24, std::byte{7});
  BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact | frame_flag_inline,
                                          float32_2x3(data)),
                            "compact-entries feature was not negotiated"));
  BOOST_TEST(c.l.rows.empty());
}

BOOST_AUTO_TEST_CASE(a_compact_payload_shorter_than_its_fixed_fields_is_refused) {
  consumer_side c;
  BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, std::vector<std::byte>(15)),
                            "payload of 15 bytes not in [16,"));
  consumer_side stamped;
  BOOST_TEST(refused_naming(
      stamped.entry_begin(frame_flag_compact | frame_flag_timestamp, std::vector<std::byte>(23)),
      "payload of 23 bytes not in [24,"));
  // The codec's own check, for a caller without the header's.
  auto v = decode_compact_entry_begin(std::vector<std::byte>(15), false, 64, 4096);
  BOOST_TEST(v.code() == errc::protocol_violation);
  BOOST_TEST(v.message().find("shorter than its 16 fixed bytes") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_compact_payload_longer_than_its_limits_allow_is_refused_at_the_header) {
  // 4 + max_key + max_meta: key_len, then key and compact meta at their limits.
  consumer_side c(known_features, decoder_limits{.max_key_bytes = 4, .max_meta_bytes = 20});
  BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, std::vector<std::byte>(29)),
                            "payload of 29 bytes not in [16, 28]"));
  consumer_side inl(known_features,
                    decoder_limits{.inline_bytes = 8, .max_key_bytes = 4, .max_meta_bytes = 20});
  BOOST_TEST(refused_naming(
      inl.entry_begin(frame_flag_compact | frame_flag_inline, std::vector<std::byte>(37)),
      "payload of 37 bytes not in [16, 36]"));
}

BOOST_AUTO_TEST_CASE(a_compact_payload_cut_short_is_refused_naming_dims_and_key) {
  consumer_side c;
  auto p = float32_2x3({});
  p.pop_back();  // the key's byte
  BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p), "compact dims and key run past"));
  consumer_side c2;
  auto q = float32_2x3({});
  q.resize(20);  // half a dim
  BOOST_TEST(refused_naming(c2.entry_begin(frame_flag_compact, q), "compact dims and key run past"));
}

BOOST_AUTO_TEST_CASE(bytes_after_a_compact_key_need_the_inline_flag) {
  consumer_side c;
  auto p = float32_2x3({});
  p.push_back(std::byte{0});
  BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p), "1 bytes after the key"));
}

BOOST_AUTO_TEST_CASE(a_compact_key_over_max_key_bytes_is_refused) {
  consumer_side c(known_features, decoder_limits{.max_key_bytes = 4});
  const auto p = encode_compact_entry_begin("12345", 'p', 0, 0, {});
  BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p), "compact key_len 5"));
}

BOOST_AUTO_TEST_CASE(an_unknown_compact_kind_is_refused) {
  consumer_side c;
  const auto p = encode_compact_entry_begin("x", 'q', 1, 4, {});
  BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p), "compact kind 113"));
}

BOOST_AUTO_TEST_CASE(a_reserved_dtype_code_is_refused) {
  for (std::uint8_t code : {std::uint8_t{26}, std::uint8_t{63}, std::uint8_t{89},
                            std::uint8_t{255}}) {
    consumer_side c;
    const auto p = encode_compact_entry_begin("x", 't', code, 4, {});
    BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p),
                              "compact dtype code " + std::to_string(code) + " is reserved"));
  }
}

BOOST_AUTO_TEST_CASE(a_dtype_code_of_another_kind_is_refused) {
  const std::vector<std::int64_t> one{1};
  struct bad {
    char kind;
    std::uint8_t code;
    std::vector<std::int64_t> dims;
  };
  for (const bad& b : {bad{'t', 74, one},  // <f4 on a tensor
                       bad{'n', 1, one},   // float32 on an ndarray
                       bad{'n', 0, one},   // an ndarray without a dtype
                       bad{'t', 0, one},   // a tensor without one (msgpack form only)
                       bad{'p', 1, {}},    // a pickle with a dtype
                       bad{'p', 0, one}}) {  // a pickle with dims
    consumer_side c;
    const auto p = encode_compact_entry_begin("x", b.kind, b.code, 4, b.dims);
    BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p),
                              std::string("does not fit kind ") + b.kind),
               b.kind << " code " << int{b.code});
  }
  consumer_side ok;
  BOOST_TEST(ok.entry_begin(frame_flag_compact | frame_flag_inline,
                            encode_compact_entry_begin("x", 'p', 0, 1, {},
                                                       std::vector<std::byte>(1)))
                 .has_value());
}

BOOST_AUTO_TEST_CASE(ndim_is_bounded_by_64_and_by_max_meta_bytes) {
  {
    consumer_side c(known_features, decoder_limits{.max_meta_bytes = 1 << 16});
    const std::vector<std::int64_t> dims(65, 1);
    const auto p = encode_compact_entry_begin("x", 'n', 66, 1, dims);
    BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p), "compact ndim 65 over"));
  }
  {
    consumer_side c(known_features, decoder_limits{.max_meta_bytes = 100});
    const std::vector<std::int64_t> dims(12, 1);  // 12 + 96 > 100
    const auto p = encode_compact_entry_begin("x", 'n', 66, 1, dims);
    BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p), "compact ndim 12 over"));
  }
  {  // 11 dims fit 100 bytes
    consumer_side c(known_features, decoder_limits{.max_meta_bytes = 100});
    const std::vector<std::int64_t> dims(11, 1);
    const auto p = encode_compact_entry_begin("x", 'n', 66, 1, dims, std::vector<std::byte>(1));
    auto r = c.entry_begin(frame_flag_compact | frame_flag_inline, p);
    BOOST_TEST(r.has_value(), r.message());
  }
}

BOOST_AUTO_TEST_CASE(a_dim_outside_0_to_2_pow_62_is_refused) {
  for (std::int64_t d : {std::int64_t{-1}, (std::int64_t{1} << 62) + 1}) {
    consumer_side c;
    const std::vector<std::int64_t> dims{1, d};
    const auto p = encode_compact_entry_begin("x", 'n', 66, 1, dims);
    BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p), "compact dim 1 is"));
  }
}

BOOST_AUTO_TEST_CASE(a_compact_row_passes_the_same_checks_as_a_msgpack_row) {
  {  // shape x itemsize != len
    consumer_side c;
    const auto p = encode_compact_entry_begin("x", 't', 1, 20, two_by_three);
    BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, p), "shape x itemsize is 24"));
  }
  {  // inline bytes that are not len
    consumer_side c;
    auto p = float32_2x3(std::vector<std::byte>(24));
    p.pop_back();
    BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact | frame_flag_inline, p),
                              "23 inline bytes for an entry of 24"));
  }
  {  // over max_entry_bytes
    consumer_side c(known_features, decoder_limits{.max_entry_bytes = 16});
    BOOST_TEST(refused_naming(c.entry_begin(frame_flag_compact, float32_2x3({})),
                              "exceed max_entry_bytes 16"));
  }
  {  // the window: the compact credit, not more, not less
    const std::uint64_t credit = compact_entry_credit(24, 1, 2);
    consumer_side fits(known_features, decoder_limits{.window_bytes = credit});
    BOOST_TEST(fits.entry_begin(frame_flag_compact, float32_2x3({})).has_value());
    BOOST_TEST(fits.d.buffered_bytes() == credit);
  }
}

// ---- the sender session ------------------------------------------------------

namespace {

struct planned_row {
  std::vector<std::byte> bytes;
  layout_builder lb;
  const planned_entry* pe = nullptr;
  planned_row(std::string dtype, char kind = 't') : bytes(8) {
    value v = kind == 't' ? value::tensor_bytes(bytes, dtype, shape_t{2})
                          : value::ndarray_bytes(bytes, dtype, shape_t{2});
    pe = *lb.add("k", std::move(v));
  }
};

std::uint8_t entry_flags(const outbox& out) {
  const auto bytes = flatten(out);
  // After blob_begin (24 + 16 bytes).
  auto h = decode_frame_header(std::span(bytes).subspan(frame_header_size + TAG_SIZE),
                               ~std::uint32_t{0});
  BOOST_TEST_REQUIRE(h.has_value());
  BOOST_TEST_REQUIRE((h->type == frame_type::entry_begin));
  return h->flags;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_session_sends_compact_iff_negotiated_and_coded) {
  planned_row f32("float32"), rec("|V4", 'n'), npy("=f4", 'n'), le("<f4", 'n');
  struct want {
    const planned_row* row;
    std::uint64_t features;
    bool compact;
  };
  for (const want& w : {want{&f32, feature_compact_entries, true}, want{&f32, 0, false},
                        want{&f32, known_features & ~feature_compact_entries, false},
                        want{&rec, feature_compact_entries, false},
                        want{&npy, feature_compact_entries, false},
                        want{&le, feature_compact_entries, true}}) {
    const Entry& e = w.row->pe->entry;
    sender_session s;
    outbox out;
    s.connect(sender_limits{.features = w.features}, &out);
    sender_blob b(tag_of(2));
    BOOST_TEST(s.compact_code_for(e).has_value() == w.compact, *e.dtype << " features " << w.features);
    BOOST_TEST(s.needs_meta(b, e) == !w.compact);
    std::vector<std::byte> meta;
    if (s.needs_meta(b, e)) e.append_meta(meta);
    auto credit = s.plan_entry(b, e, meta);
    BOOST_TEST_REQUIRE(credit.has_value());
    BOOST_TEST(*credit == (w.compact ? compact_entry_credit(8, 1, 1) : entry_credit(8, 1, meta.size())));
    auto room = s.add_entry(b, e, meta, 0, entry_route::automatic);
    BOOST_TEST(room.size() == 8u);
    const std::uint8_t flags = entry_flags(out);
    BOOST_TEST(((flags & frame_flag_compact) != 0) == w.compact, *e.dtype);
    BOOST_TEST((flags & frame_flag_inline) != 0);
  }
}

BOOST_AUTO_TEST_CASE(the_form_chosen_for_an_entry_follows_a_new_connection) {
  planned_row f32("float32");
  const Entry& e = f32.pe->entry;
  sender_session s;
  outbox out;
  s.connect(sender_limits{.features = feature_compact_entries}, &out);
  sender_blob b(tag_of(4));
  BOOST_TEST(!s.needs_meta(b, e));  // compact here
  outbox out2;
  s.connect(sender_limits{.features = 0}, &out2);  // the same Entry, planned anew
  BOOST_TEST(s.needs_meta(b, e));
  const auto meta = e.meta();
  auto credit = s.plan_entry(b, e, meta);
  BOOST_TEST_REQUIRE(credit.has_value());
  BOOST_TEST(*credit == entry_credit(8, 1, meta.size()));
  (void)s.add_entry(b, e, meta, 0, entry_route::automatic);
  BOOST_TEST((entry_flags(out2) & frame_flag_compact) == 0);
}

BOOST_AUTO_TEST_CASE(too_many_dims_for_the_consumers_max_meta_bytes_fall_back_to_msgpack) {
  std::vector<std::byte> bytes(8);
  layout_builder lb;
  const planned_entry* pe = *lb.add("k", value::ndarray_bytes(bytes, "|u1", shape_t{2, 2, 2}));
  sender_session s;
  outbox out;
  // 12 + 3 x 8 = 36 bytes of compact meta: 35 is too few.
  s.connect(sender_limits{.features = feature_compact_entries, .max_meta_bytes = 35}, &out);
  BOOST_TEST(!s.compact_code_for(pe->entry).has_value());
  s.connect(sender_limits{.features = feature_compact_entries, .max_meta_bytes = 36}, &out);
  BOOST_TEST(s.compact_code_for(pe->entry).has_value());
}

BOOST_AUTO_TEST_CASE(a_resend_session_keeps_meta_and_charges_each_connections_form) {
  planned_row f32("float32");
  const Entry& e = f32.pe->entry;
  sender_session s({.resend = true});
  outbox out;
  s.connect(sender_limits{.features = feature_compact_entries, .dedup_window = 8}, &out);
  auto b = std::make_shared<sender_blob>(tag_of(3));
  BOOST_TEST(s.needs_meta(*b, e));  // a later connection may not take the compact form
  BOOST_TEST(s.list(b));
  kept_entry k{.entry = e, .meta = e.meta(), .bytes = f32.bytes, .emitted_ns = 0};
  const std::size_t meta_bytes = k.meta.size();
  s.keep_entry(*b, std::move(k));
  BOOST_TEST((s.next_step(*b) == sync_step::entry));
  BOOST_TEST(s.kept_credit(*b) == compact_entry_credit(8, 1, 1));
  (void)s.send_kept_entry(*b);
  BOOST_TEST((entry_flags(out) & frame_flag_compact) != 0);
  // A new connection without the feature: the msgpack form and its credit.
  outbox out2;
  s.connect(sender_limits{.features = 0, .dedup_window = 8}, &out2);
  BOOST_TEST((s.next_step(*b) == sync_step::entry));
  BOOST_TEST(s.kept_credit(*b) == entry_credit(8, 1, meta_bytes));
  (void)s.send_kept_entry(*b);
  BOOST_TEST((entry_flags(out2) & frame_flag_compact) == 0);
}

// entry_announcement::type: the dtype the decoder's check found, handed to
// the listener so the consumer's view needs no second lookup; a pointer
// that outlives the call (the format's tables), or null where the decoder
// has none (a pickle; a numpy row in the msgpack form, whose lookup lives
// in a per-thread cache only).
BOOST_AUTO_TEST_CASE(an_announced_row_carries_its_checked_dtype_where_it_lives_on) {
  std::vector<std::byte> data(24);
  for (std::uint8_t code : {std::uint8_t{1}, std::uint8_t{74}, std::uint8_t{85}}) {
    const compact_dtype* d = compact_dtype_of(code);
    const std::size_t itemsize = format_dtype_of(*d).itemsize;
    const std::vector<std::int64_t> shape{static_cast<std::int64_t>(24 / itemsize)};
    consumer_side c;
    BOOST_TEST_REQUIRE(c.entry_begin(frame_flag_compact | frame_flag_inline,
                                     encode_compact_entry_begin("x", d->kind, code, 24, shape,
                                                                data))
                           .has_value());
    BOOST_TEST_REQUIRE(c.l.types.size() == 1u);
    BOOST_TEST_REQUIRE(c.l.types[0] != nullptr, "compact code " << int(code));
    BOOST_TEST(c.l.types[0] == &format_dtype_of(*d));
    BOOST_TEST(c.l.types[0]->name == d->name);
  }
  // The msgpack form: a torch row gets the torch table's entry, a numpy
  // row none, a pickle none.
  auto msgpack_row = [&](Entry e) {
    consumer_side c(known_features & ~feature_compact_entries);
    auto p = encode_entry_begin(e.key, e.meta(), data);
    BOOST_TEST_REQUIRE(c.entry_begin(frame_flag_inline, p).has_value());
    BOOST_TEST_REQUIRE(c.l.types.size() == 1u);
    return c.l.types[0];
  };
  const dtype* torch_row = msgpack_row({"t", 0, 24, 't', "float32", shape_t{6}});
  BOOST_TEST(torch_row == lookup_dtype('t', "float32"));
  // An alias, the "torch." prefix and no dtype at all are float32 too.
  BOOST_TEST(msgpack_row({"t", 0, 24, 't', "float", shape_t{6}}) == torch_row);
  BOOST_TEST(msgpack_row({"t", 0, 24, 't', "torch.float32", shape_t{6}}) == torch_row);
  BOOST_TEST(msgpack_row({"t", 0, 24, 't', std::nullopt, shape_t{6}}) == torch_row);
  BOOST_TEST(msgpack_row({"n", 0, 24, 'n', "<f4", shape_t{6}}) == nullptr);
  BOOST_TEST(msgpack_row({"p", 0, 24, 'p', std::nullopt, std::nullopt}) == nullptr);
}

// The view built with the announced dtype is the view built without it.
BOOST_AUTO_TEST_CASE(a_view_with_the_announced_dtype_equals_one_looked_up) {
  std::vector<std::byte> data(24);
  for (std::uint8_t code = 0; code < 255; ++code) {
    const compact_dtype* d = compact_dtype_of(code);
    if (!d) continue;
    const dtype& type = format_dtype_of(*d);
    if (type.itemsize == 0 || 24 % type.itemsize != 0) continue;
    const Entry e{"x", 0, 24, d->kind, std::string(d->name),
                  shape_t{static_cast<std::int64_t>(24 / type.itemsize)}};
    BOOST_TEST_REQUIRE(validate_entry(e, 24).has_value(), d->name);
    const entry_view given = view_valid_entry(e, data, &type);
    const entry_view looked_up = view_valid_entry(e, data);
    BOOST_TEST((given.type == looked_up.type), d->name);
    BOOST_TEST((given.shape == looked_up.shape), d->name);
    BOOST_TEST(given.bytes.data() == looked_up.bytes.data());
  }
}
