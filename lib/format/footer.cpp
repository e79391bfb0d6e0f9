#include "blobpipe/format/footer.hpp"

#include <cstring>
#include <random>

#include "lib/format/le.hpp"

namespace blobpipe {

void encode_footer(const footer& f, std::span<std::byte> out) noexcept {
  std::byte* p = out.data();
  detail::store_le<std::uint32_t>(p + 0, MAGIC);
  detail::store_le<std::uint16_t>(p + 4, VERSION);
  detail::store_le<std::uint16_t>(p + 6, f.flags);
  detail::store_le<std::uint32_t>(p + 8, f.index_off);
  detail::store_le<std::uint32_t>(p + 12, f.index_len);
  std::memcpy(p + 16, f.tag.data(), TAG_SIZE);
}

result<footer> read_footer(std::span<const std::byte> blob) {
  const std::size_t n = blob.size();
  if (n < FOOTER_V2_SIZE)
    return make_error(errc::too_small, "blob of " + std::to_string(n) +
                                           " bytes is too small for a footer (16)");
  auto try_footer = [&](std::size_t size, std::uint16_t version) -> std::optional<footer> {
    if (n < size) return std::nullopt;
    const std::byte* p = blob.data() + (n - size);
    if (detail::load_le<std::uint32_t>(p) != MAGIC) return std::nullopt;
    if (detail::load_le<std::uint16_t>(p + 4) != version) return std::nullopt;
    footer f;
    f.version = version;
    f.flags = detail::load_le<std::uint16_t>(p + 6);
    f.index_off = detail::load_le<std::uint32_t>(p + 8);
    f.index_len = detail::load_le<std::uint32_t>(p + 12);
    if (size == FOOTER_SIZE) std::memcpy(f.tag.data(), p + 16, TAG_SIZE);
    return f;
  };
  if (auto f = try_footer(FOOTER_SIZE, VERSION)) return *f;
  if (auto f = try_footer(FOOTER_V2_SIZE, VERSION_V2)) return *f;
  return make_error(errc::bad_footer, "bad blob magic or unsupported blob version");
}

bool footer_is_valid(std::span<const std::byte> tail) noexcept {
  try {
    return read_footer(tail).has_value();
  } catch (...) {  // std::to_string may throw bad_alloc; "not valid" is the answer
    return false;
  }
}

std::optional<tag_t> footer_tag(std::span<const std::byte> tail) noexcept {
  try {
    auto f = read_footer(tail);
    if (!f || f->version != VERSION || f->tag == NO_TAG) return std::nullopt;
    return f->tag;
  } catch (...) {
    return std::nullopt;
  }
}

result<tag_t> make_tag(std::span<const std::byte> bytes) {
  if (bytes.size() > TAG_SIZE)
    return make_error(errc::invalid_argument,
                      "tag of " + std::to_string(bytes.size()) + " bytes exceeds 16");
  tag_t t{};
  std::memcpy(t.data(), bytes.data(), bytes.size());
  return t;
}

result<tag_t> make_tag(std::string_view text) {
  return make_tag(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

tag_t random_tag() {
  thread_local std::mt19937_64 gen{[] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }()};
  tag_t t;
  for (std::size_t i = 0; i < TAG_SIZE; i += 8) {
    std::uint64_t r = gen();
    std::memcpy(t.data() + i, &r, 8);
  }
  // RFC 4122 version 4, variant 10xx.
  t[6] = (t[6] & std::byte{0x0F}) | std::byte{0x40};
  t[8] = (t[8] & std::byte{0x3F}) | std::byte{0x80};
  return t;
}

std::string tag_hex(const tag_t& tag) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(TAG_SIZE * 2);
  for (std::byte b : tag) {
    s.push_back(digits[std::to_integer<unsigned>(b) >> 4]);
    s.push_back(digits[std::to_integer<unsigned>(b) & 0xF]);
  }
  return s;
}

}  // namespace blobpipe
