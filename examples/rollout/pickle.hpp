// examples/rollout/pickle.hpp — a tiny pickle writer for flat dicts.
//
// NeMo RL carries per-sample Python objects (here: `{sample}@meta`) as 'p'
// entries: opaque pickle bytes. The example builds real pickle bytes so
// that the Python side could `pickle.loads` them; only what a metadata
// dict needs is supported: str keys; None, bool, int (any int64), float
// and str values.
//
//   auto b = rollout::pickle_dict({{"idx", std::int64_t{7}}, {"source", "riddles"}});
//   // pickle.loads(b) == {'idx': 7, 'source': 'riddles'}
//
// The bytes are protocol 2 and equal what CPython writes for the same dict
// after pickletools.optimize (which only drops unused memo entries):
// PROTO 2, EMPTY_DICT, then SETITEM for one item or MARK ... SETITEMS for
// more (CPython batches 1000 items per SETITEMS; so does this), STOP.
// Source: CPython Lib/pickle.py (_Pickler.save_dict, save_long, save_str).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace rollout {

/// A value in a pickled dict. std::monostate is Python's None.
using pickle_scalar = std::variant<std::monostate, bool, std::int64_t, double, std::string>;

/// One (key, value) item; items keep their order (Python dicts are ordered).
using pickle_item = std::pair<std::string, pickle_scalar>;

/// Pickles a dict of `items` (protocol 2). Keys and str values are UTF-8.
std::vector<std::byte> pickle_dict(std::span<const pickle_item> items);
std::vector<std::byte> pickle_dict(std::initializer_list<pickle_item> items);

}  // namespace rollout
