// blobpipe/format/pickle.hpp — a small pickle writer for the Python objects
// RL metadata needs, so a C++ producer can emit kind 'p' entries that
// Python's `pickle.loads` reads.
//
// NeMo RL carries per-sample Python objects (`{sample}@meta`, say) as
// opaque pickle bytes; value::pickle(bytes) emits them. This writer covers
// None, bool, int (int64 or uint64), float, str, bytes, list, tuple and dict (str
// keys, in order), nested to any depth up to max_pickle_depth:
//
//   using pv = blobpipe::pickle_value;
//   auto b = blobpipe::pickle(pv::dict{{"idx", 7}, {"source", "riddles"},
//                                      {"scores", pv::list{0.5, 1.0}},
//                                      {"span", pv::tuple{{3, 9}}},
//                                      {"raw", pv::bytes{{std::byte{1}}}}}).value();
//   // pickle.loads(b) == {'idx': 7, 'source': 'riddles', 'scores': [0.5, 1.0],
//   //                     'span': (3, 9), 'raw': b'\x01'}
//
// The bytes are protocol 2 (readable by every Python 3, and by Python 2
// for what it has) and equal what CPython writes for the same object with
// `pickle.dumps(obj, protocol=2)` after `pickletools.optimize` (which only
// drops memo opcodes: this writer memoizes nothing, so an object shared
// twice is written twice). bytes are written as protocol 2 does, as a
// call of `_codecs.encode(str, 'latin1')` (`__builtin__.bytes()` when
// empty), which `pickle.loads` turns back into bytes.
// Source: CPython Lib/pickle.py (_Pickler.save_none, save_bool, save_long,
// save_float, save_str, save_bytes, save_tuple, save_list, save_dict;
// opcodes as defined there), and for the batches of list and dict items
// Modules/_pickle.c (batch_list_exact, batch_dict_exact), the C pickler
// that pickle.dumps runs, which batches a little differently from
// Lib/pickle.py's _batch_appends and _batch_setitems.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "blobpipe/errors.hpp"

namespace blobpipe {

/// Deepest nesting of lists, tuples and dicts pickle() writes (the value
/// itself is depth 1): the default recursion limit of CPython's pickler,
/// which refuses deeper objects the same way.
inline constexpr std::size_t max_pickle_depth = 1000;

/// A Python object to pickle.
struct pickle_value {
  using list = std::vector<pickle_value>;
  /// A tuple (its own type, so `{1, 2}` stays a list unless said).
  struct tuple {
    std::vector<pickle_value> items;
  };
  /// A dict: str keys (UTF-8), items in order (Python dicts keep it).
  using dict = std::vector<std::pair<std::string, pickle_value>>;
  /// Python bytes (a str is text: UTF-8).
  struct bytes {
    std::vector<std::byte> data;
  };

  /// std::monostate is None.
  using variant = std::variant<std::monostate, bool, std::int64_t, std::uint64_t, double,
                               std::string, bytes, list, tuple, dict>;
  variant v;

  pickle_value() = default;  ///< None
  pickle_value(std::monostate) {}
  pickle_value(std::nullptr_t) {}  ///< None
  pickle_value(bool b) : v(b) {}
  /// Any integer type: a Python int (signed ones kept as int64, unsigned
  /// ones as uint64).
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  pickle_value(T i) {
    if constexpr (std::is_signed_v<T>) {
      v = static_cast<std::int64_t>(i);
    } else {
      v = static_cast<std::uint64_t>(i);
    }
  }
  pickle_value(double d) : v(d) {}
  pickle_value(float f) : v(static_cast<double>(f)) {}
  pickle_value(std::string s) : v(std::move(s)) {}
  pickle_value(std::string_view s) : v(std::string(s)) {}
  pickle_value(const char* s) : v(std::string(s)) {}
  pickle_value(bytes b) : v(std::move(b)) {}
  pickle_value(list l) : v(std::move(l)) {}
  pickle_value(tuple t) : v(std::move(t)) {}
  pickle_value(dict d) : v(std::move(d)) {}
};

/// Pickles `value` (protocol 2; bytes as CPython writes them, see above).
/// Errors: invalid_argument (nested deeper than max_pickle_depth),
/// too_large (a str or bytes of 2^32 bytes or more, beyond BINUNICODE's
/// 32-bit length). Source: CPython Lib/pickle.py, _Pickler.save.
[[nodiscard]] result<std::vector<std::byte>> pickle(const pickle_value& value);

}  // namespace blobpipe
