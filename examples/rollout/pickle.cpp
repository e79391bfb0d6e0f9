// examples/rollout/pickle.cpp — see pickle.hpp. Opcode values are those of
// CPython's Lib/pickle.py.
#include "examples/rollout/pickle.hpp"

#include <bit>
#include <cstring>

namespace rollout {
namespace {

enum op : std::uint8_t {
  PROTO = 0x80, STOP = '.', MARK = '(', NONE = 'N',
  NEWTRUE = 0x88, NEWFALSE = 0x89,
  BININT1 = 'K', BININT2 = 'M', BININT = 'J', LONG1 = 0x8a,
  BINFLOAT = 'G', BINUNICODE = 'X',
  EMPTY_DICT = '}', SETITEM = 's', SETITEMS = 'u',
};

// CPython pickles this many dict items per MARK ... SETITEMS batch.
constexpr std::size_t batch_items = 1000;

class writer {
 public:
  void byte(std::uint8_t b) { out_.push_back(static_cast<std::byte>(b)); }
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) byte(static_cast<std::uint8_t>(v >> (8 * i)));
  }

  void str(const std::string& s) {
    // Protocols 2 and 3 write every str as BINUNICODE (u32 length).
    byte(BINUNICODE);
    le(s.size(), 4);
    for (char c : s) byte(static_cast<std::uint8_t>(c));
  }

  void integer(std::int64_t v) {
    if (v >= 0 && v <= 0xff) {
      byte(BININT1);
      le(static_cast<std::uint64_t>(v), 1);
    } else if (v >= 0 && v <= 0xffff) {
      byte(BININT2);
      le(static_cast<std::uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      byte(BININT);
      le(static_cast<std::uint64_t>(v), 4);
    } else {
      // LONG1: the shortest little-endian two's complement that keeps the
      // sign, as pickle.encode_long produces it.
      int n = 8;
      auto u = static_cast<std::uint64_t>(v);
      while (n > 1) {
        std::uint8_t top = static_cast<std::uint8_t>(u >> (8 * (n - 1)));
        std::uint8_t next_sign = static_cast<std::uint8_t>(u >> (8 * (n - 2))) & 0x80;
        if ((top == 0x00 && !next_sign) || (top == 0xff && next_sign)) --n;
        else break;
      }
      byte(LONG1);
      byte(static_cast<std::uint8_t>(n));
      le(u, n);
    }
  }

  void floating(double d) {
    byte(BINFLOAT);  // IEEE 754 double, big-endian
    auto bits = std::bit_cast<std::uint64_t>(d);
    for (int i = 7; i >= 0; --i) byte(static_cast<std::uint8_t>(bits >> (8 * i)));
  }

  void scalar(const pickle_scalar& v) {
    struct visit {
      writer& w;
      void operator()(std::monostate) { w.byte(NONE); }
      void operator()(bool b) { w.byte(b ? NEWTRUE : NEWFALSE); }
      void operator()(std::int64_t i) { w.integer(i); }
      void operator()(double d) { w.floating(d); }
      void operator()(const std::string& s) { w.str(s); }
    };
    std::visit(visit{*this}, v);
  }

  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

}  // namespace

std::vector<std::byte> pickle_dict(std::span<const pickle_item> items) {
  writer w;
  w.byte(PROTO);
  w.byte(2);
  w.byte(EMPTY_DICT);
  for (std::size_t i = 0; i < items.size(); i += batch_items) {
    std::size_t n = std::min(batch_items, items.size() - i);
    if (n > 1) w.byte(MARK);
    for (std::size_t j = i; j < i + n; ++j) {
      w.str(items[j].first);
      w.scalar(items[j].second);
    }
    w.byte(n > 1 ? SETITEMS : SETITEM);
  }
  w.byte(STOP);
  return w.take();
}

std::vector<std::byte> pickle_dict(std::initializer_list<pickle_item> items) {
  return pickle_dict(std::span<const pickle_item>(items.begin(), items.size()));
}

}  // namespace rollout
