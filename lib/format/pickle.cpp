// The pickle writer (blobpipe/format/pickle.hpp). Opcode values and the
// order of what is written are those of CPython's Lib/pickle.py.
#include "blobpipe/format/pickle.hpp"

#include <bit>
#include <string_view>

namespace blobpipe {
namespace {

enum op : std::uint8_t {
  PROTO = 0x80, STOP = '.', MARK = '(', NONE = 'N',
  NEWTRUE = 0x88, NEWFALSE = 0x89,
  BININT1 = 'K', BININT2 = 'M', BININT = 'J', LONG1 = 0x8a,
  BINFLOAT = 'G', BINUNICODE = 'X', GLOBAL = 'c', REDUCE = 'R',
  EMPTY_TUPLE = ')', TUPLE = 't', TUPLE1 = 0x85, TUPLE2 = 0x86, TUPLE3 = 0x87,
  EMPTY_LIST = ']', APPEND = 'a', APPENDS = 'e',
  EMPTY_DICT = '}', SETITEM = 's', SETITEMS = 'u',
};

// CPython appends and sets this many items per MARK ... APPENDS/SETITEMS
// batch (BATCHSIZE in Modules/_pickle.c, _BATCHSIZE in Lib/pickle.py).
constexpr std::size_t batch_items = 1000;
constexpr std::uint64_t max_u32 = 0xffffffffu;

class writer {
 public:
  result<void> save(const pickle_value& v, std::size_t depth) {
    struct visit {
      writer& w;
      std::size_t depth;
      result<void> operator()(std::monostate) { return w.byte(NONE), result<void>{}; }
      result<void> operator()(bool b) { return w.byte(b ? NEWTRUE : NEWFALSE), result<void>{}; }
      result<void> operator()(std::int64_t i) { return w.integer(i), result<void>{}; }
      result<void> operator()(std::uint64_t u) { return w.unsigned_integer(u), result<void>{}; }
      result<void> operator()(double d) { return w.floating(d), result<void>{}; }
      result<void> operator()(const std::string& s) { return w.str(s); }
      result<void> operator()(const pickle_value::bytes& b) { return w.bytes(b.data); }
      result<void> operator()(const pickle_value::list& l) { return w.list(l, depth); }
      result<void> operator()(const pickle_value::tuple& t) { return w.tuple(t.items, depth); }
      result<void> operator()(const pickle_value::dict& d) { return w.dict(d, depth); }
    };
    return std::visit(visit{*this, depth}, v.v);
  }

  void byte(std::uint8_t b) { out_.push_back(static_cast<std::byte>(b)); }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) byte(static_cast<std::uint8_t>(v >> (8 * i)));
  }

  // save_str: protocols 2 and 3 write every str as BINUNICODE (u32 length).
  result<void> str(std::string_view s) {
    if (s.size() > max_u32)
      return {errc::too_large, "pickle: a str of " + std::to_string(s.size()) +
                                   " bytes (protocol 2 holds at most 2^32 - 1)"};
    byte(BINUNICODE);
    le(s.size(), 4);
    for (char c : s) byte(static_cast<std::uint8_t>(c));
    return {};
  }

  // save_bytes below protocol 3: a call of _codecs.encode(str(b, 'latin1'),
  // 'latin1'), or of __builtin__.bytes() for b'' (save_global maps
  // builtins to __builtin__ for protocol 2, as fix_imports does).
  result<void> bytes(const std::vector<std::byte>& b) {
    if (b.empty()) {
      global("__builtin__", "bytes");
      byte(EMPTY_TUPLE);
      byte(REDUCE);
      return {};
    }
    // Latin-1 decoded, then UTF-8 encoded: bytes >= 0x80 take two.
    std::string text;
    text.reserve(b.size());
    for (std::byte x : b) {
      const auto c = std::to_integer<unsigned>(x);
      if (c < 0x80) {
        text.push_back(static_cast<char>(c));
      } else {
        text.push_back(static_cast<char>(0xc0 | (c >> 6)));
        text.push_back(static_cast<char>(0x80 | (c & 0x3f)));
      }
    }
    global("_codecs", "encode");
    if (auto ok = str(text); !ok) return ok;
    (void)str("latin1");
    byte(TUPLE2);
    byte(REDUCE);
    return {};
  }

  void global(std::string_view module, std::string_view name) {
    byte(GLOBAL);
    for (char c : module) byte(static_cast<std::uint8_t>(c));
    byte('\n');
    for (char c : name) byte(static_cast<std::uint8_t>(c));
    byte('\n');
  }

  // save_long (protocol 2).
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
        const auto top = static_cast<std::uint8_t>(u >> (8 * (n - 1)));
        const auto next_sign = static_cast<std::uint8_t>(u >> (8 * (n - 2))) & 0x80;
        if ((top == 0x00 && !next_sign) || (top == 0xff && next_sign)) --n;
        else break;
      }
      byte(LONG1);
      byte(static_cast<std::uint8_t>(n));
      le(u, n);
    }
  }

  // An int above int64: LONG1 of 8 bytes and a zero sign byte.
  void unsigned_integer(std::uint64_t u) {
    if (u <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(u));
    byte(LONG1);
    byte(9);
    le(u, 8);
    byte(0);
  }

  // save_float: BINFLOAT, an IEEE 754 double, big-endian.
  void floating(double d) {
    byte(BINFLOAT);
    const auto bits = std::bit_cast<std::uint64_t>(d);
    for (int i = 7; i >= 0; --i) byte(static_cast<std::uint8_t>(bits >> (8 * i)));
  }

  static result<void> too_deep() {
    return {errc::invalid_argument, "pickle: nested deeper than " +
                                        std::to_string(max_pickle_depth) +
                                        " lists, tuples and dicts (max_pickle_depth)"};
  }

  // save_tuple (protocol 2): up to three items then TUPLE1..3, more
  // between MARK and TUPLE.
  result<void> tuple(const std::vector<pickle_value>& items, std::size_t depth) {
    if (depth >= max_pickle_depth) return too_deep();
    if (items.empty()) {
      byte(EMPTY_TUPLE);
      return {};
    }
    if (items.size() > 3) byte(MARK);
    for (const auto& x : items)
      if (auto ok = save(x, depth + 1); !ok) return ok;
    static constexpr std::uint8_t sized[] = {0, TUPLE1, TUPLE2, TUPLE3};
    byte(items.size() > 3 ? std::uint8_t{TUPLE} : sized[items.size()]);
    return {};
  }

  // save_list as CPython's C pickler (Modules/_pickle.c, batch_list_exact,
  // which pickle.dumps runs): one item is APPEND; more go in batches of
  // 1000 between MARK and APPENDS, a last batch of one included.
  result<void> list(const std::vector<pickle_value>& items, std::size_t depth) {
    if (depth >= max_pickle_depth) return too_deep();
    byte(EMPTY_LIST);
    if (items.size() == 1) {
      if (auto ok = save(items[0], depth + 1); !ok) return ok;
      byte(APPEND);
      return {};
    }
    for (std::size_t i = 0; i < items.size(); i += batch_items) {
      byte(MARK);
      for (std::size_t j = i; j < std::min(items.size(), i + batch_items); ++j)
        if (auto ok = save(items[j], depth + 1); !ok) return ok;
      byte(APPENDS);
    }
    return {};
  }

  // save_dict as the C pickler (batch_dict_exact): one item is SETITEM;
  // more go in batches of 1000 between MARK and SETITEMS, and a dict of a
  // multiple of 1000 items ends with an empty MARK SETITEMS (its loop
  // stops only after a batch that is not full).
  result<void> dict(const pickle_value::dict& items, std::size_t depth) {
    if (depth >= max_pickle_depth) return too_deep();
    byte(EMPTY_DICT);
    if (items.empty()) return {};
    const auto item = [&](const auto& kv) -> result<void> {
      if (auto ok = str(kv.first); !ok) return ok;
      return save(kv.second, depth + 1);
    };
    if (items.size() == 1) {
      if (auto ok = item(items[0]); !ok) return ok;
      byte(SETITEM);
      return {};
    }
    std::size_t i = 0, in_batch = 0;
    do {
      byte(MARK);
      for (in_batch = 0; i < items.size() && in_batch < batch_items; ++i, ++in_batch)
        if (auto ok = item(items[i]); !ok) return ok;
      byte(SETITEMS);
    } while (in_batch == batch_items);
    return {};
  }

  std::vector<std::byte> out_;
};

}  // namespace

result<std::vector<std::byte>> pickle(const pickle_value& value) {
  writer w;
  w.byte(PROTO);
  w.byte(2);
  if (auto ok = w.save(value, 0); !ok) return ok.err();
  w.byte(STOP);
  return w.take();
}

}  // namespace blobpipe
