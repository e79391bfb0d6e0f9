// Sender and blob_writer behaviour (blobpipe/pipeline/producer.hpp) over loopback
// and TCP: interleaving, assembly, strided values, abort, close.
#define BOOST_TEST_MODULE producer
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "test/forwarding_transport.hpp"
#include "test/pipeline_fixture.hpp"
#include "test/skip.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

const std::vector<link_kind> both = all_links();

/// Appends every event `c` yields to `events`, end_of_stream included.
asio::awaitable<void> every_event(consumer& c, std::vector<event>& events) {
  for (;;) {
    auto ev = co_await c.next();
    events.push_back(ev);
    if (ev.kind == event_kind::end_of_stream) break;
  }
}

/// What blob `p` of producer `k` holds: entries of different sizes, one
/// larger than several chunks.
struct blob_spec {
  tag_t tag;
  std::vector<std::string> keys;
  std::vector<std::vector<float>> data;
  std::vector<value> values() const {
    std::vector<value> v;
    for (auto& d : data) v.push_back(value::tensor(d));
    return v;
  }
  std::vector<std::byte> expected() const {
    auto p = plan(keys, values(), tag).value();
    std::vector<std::byte> out(p.nbytes);
    (void)write(p, out).value();
    return out;
  }
};

blob_spec make_spec(int k, int p) {
  blob_spec s;
  s.tag = random_tag();
  for (int e = 0; e < 4; ++e) {
    s.keys.push_back(std::to_string(k) + "@" + std::to_string(p) + "/" + std::to_string(e));
    s.data.push_back(ramp(static_cast<std::size_t>(1 + 700 * e + 13 * k), float(k * 1000 + p)));
  }
  return s;
}

}  // namespace

// (c) Many blobs from concurrent producers share one connection; chunks
// interleave and every assembled blob is byte-identical to write(plan).
BOOST_AUTO_TEST_CASE(concurrent_producers_interleave_and_arrive_intact) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      constexpr int producers = 6, blobs_each = 4;
      std::map<std::string, std::vector<std::byte>> expected;  // tag hex -> bytes
      std::vector<std::vector<blob_spec>> specs(producers);
      for (int k = 0; k < producers; ++k)
        for (int p = 0; p < blobs_each; ++p) {
          specs[k].push_back(make_spec(k, p));
          expected[tag_hex(specs[k].back().tag)] = specs[k].back().expected();
        }
      consumer_options copt;
      copt.assemble = assemble_mode::memory;
      copt.max_blob_bytes = 1 << 20;
      copt.window_bytes = 32 * 1024;
      // Entries above 128 bytes go in data frames of 512, the others inline.
      auto ep = r.await(connect(l, copt, {.chunk_bytes = 512, .inline_bytes = 128}));
      int done = 0, complete = 0, max_open = 0;
      std::set<std::uint64_t> open;
      auto produce = [&](int k) -> asio::awaitable<void> {
        for (auto& spec : specs[k]) {
          auto blob = ep.s.open_blob(spec.tag);
          for (std::size_t e = 0; e < spec.keys.size(); ++e)
            BLOBPIPE_CO_CHECK(blob.emit(spec.keys[e], value::tensor(spec.data[e])));
          BLOBPIPE_CO_CHECK(blob.finish());
        }
        if (++done == producers) {
          BLOBPIPE_CO_CHECK(ep.s.shutdown());
          BOOST_TEST(ep.s.stats().tasks_running == 0u, "a task of the sender outlived shutdown()");
        }
      };
      auto consume = [&]() -> asio::awaitable<void> {
        for (;;) {
          auto ev = co_await ep.c.next();
          if (ev.kind == event_kind::entry_ready) {
            open.insert(ev.blob_id);
            max_open = std::max(max_open, static_cast<int>(open.size()));
          } else if (ev.kind == event_kind::blob_complete) {
            open.erase(ev.blob_id);
            ++complete;
            auto it = expected.find(tag_hex(ev.tag));
            BOOST_TEST_REQUIRE((it != expected.end()));
            BOOST_TEST((ev.blob->bytes.size() == it->second.size()));
            BOOST_TEST(std::memcmp(ev.blob->bytes.data(), it->second.data(),
                                   it->second.size()) == 0);
          } else {
            BOOST_TEST(ev.kind == event_kind::end_of_stream);
            BOOST_TEST(!ev.error, ev.reason);
            break;
          }
        }
      };
      for (int k = 0; k < producers; ++k) r.spawn(produce(k));
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(complete == producers * blobs_each);
      BOOST_TEST(max_open > 1);  // blobs were in flight together
      BOOST_TEST(ep.s.stats().data_frames_sent > 0u);  // some entries chunked
      BOOST_TEST(ep.s.inline_bytes() == 128u);
    }
  }
}

// A strided value is gathered (the one copy on the send path) and arrives
// in logical order; a contiguous one is not.
BOOST_AUTO_TEST_CASE(strided_value_is_gathered_in_logical_order) {
  runner r;
  std::vector<float> m = {0, 1, 2, 3, 4, 5};  // 2x3, sent transposed as 3x2
  value t = value::tensor(m, {3, 2});
  t.strides = {1, 3};
  std::vector<float> got;
  auto ep = r.await(connect(link_kind::loopback));
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob();
    BLOBPIPE_CO_CHECK(blob.emit("t", t));
    BLOBPIPE_CO_CHECK(blob.emit("m", value::tensor(m)));
    BLOBPIPE_CO_CHECK(blob.finish());
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind == event_kind::end_of_stream) break;
      if (ev.kind == event_kind::entry_ready && ev.entry->index == 0)
        for (int i = 0; i < 6; ++i) got.push_back(ev.entry->view.at<float>(i));
    }
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(got == (std::vector<float>{0, 3, 1, 4, 2, 5}), boost::test_tools::per_element());
  BOOST_TEST(ep.s.stats().gathered_entries == 1u);
}

// abort() and dropping an unfinished blob_writer both reach the consumer as
// blob_aborted; a bad value is refused without breaking the blob.
BOOST_AUTO_TEST_CASE(aborted_and_dropped_blobs_are_reported_aborted) {
  runner r;
  std::vector<event> events;
  const auto x = ramp(10, 0.0f);
  std::error_code bad_ec;
  auto ep = r.await(connect(link_kind::loopback));
  auto produce = [&]() -> asio::awaitable<void> {
    {
      auto a = ep.s.open_blob();
      BLOBPIPE_CO_CHECK(a.emit("x", value::tensor(x)));
      BLOBPIPE_CO_CHECK(a.abort("rollout cancelled"));
    }
    {
      auto d = ep.s.open_blob();
      BLOBPIPE_CO_CHECK(d.emit("x", value::tensor(x)));
    }  // dropped unfinished
    auto ok = ep.s.open_blob();
    value bad = value::tensor(x);
    bad.dtype = "float33";
    bad_ec = co_await ok.emit("bad", bad);
    BLOBPIPE_CO_CHECK(ok.emit("x", value::tensor(x)));
    BLOBPIPE_CO_CHECK(ok.finish());
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  r.spawn(produce());
  r.spawn(every_event(ep.c, events));
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST((bad_ec == errc::unknown_dtype));
  std::vector<std::pair<std::uint64_t, event_kind>> seen;
  for (auto& e : events)
    if (e.kind == event_kind::blob_aborted || e.kind == event_kind::blob_complete)
      seen.emplace_back(e.blob_id, e.kind);
  const std::vector<std::pair<std::uint64_t, event_kind>> want = {
      {1, event_kind::blob_aborted}, {2, event_kind::blob_aborted}, {3, event_kind::blob_complete}};
  BOOST_TEST((seen == want));
  for (auto& e : events)
    if (e.kind == event_kind::blob_aborted && e.blob_id == 1) {
      BOOST_TEST(e.reason == "rollout cancelled");
      BOOST_TEST((e.error == errc::aborted));
    }
  BOOST_TEST(!events.back().error);
}

// An abort without words still reaches the consumer with a reason: an
// event's reason is never empty when its error is set.
BOOST_AUTO_TEST_CASE(abort_without_reason_is_reported_with_one) {
  runner r;
  event aborted;
  const auto x = ramp(10, 0.0f);
  auto ep = r.await(connect(link_kind::loopback));
  auto produce = [&]() -> asio::awaitable<void> {
    auto a = ep.s.open_blob();
    BLOBPIPE_CO_CHECK(a.emit("x", value::tensor(x)));
    BLOBPIPE_CO_CHECK(a.abort(""));
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind == event_kind::blob_aborted) aborted = ev;
      if (ev.kind == event_kind::end_of_stream) break;
    }
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST((aborted.kind == event_kind::blob_aborted));
  BOOST_TEST((aborted.error == errc::aborted));
  BOOST_TEST(!aborted.reason.empty());
}

// Every refused emit says why in last_error(), as emit's doc promises: the
// session's checks (a key longer than the consumer's max_key_bytes) and
// the plan's (a dtype it does not know) as well as the credit's. Python
// builds its error from it (it said only "invalid argument" for the
// session's refusals before).
BOOST_AUTO_TEST_CASE(a_refused_emit_says_why_in_last_error) {
  runner r;
  consumer_options copt;
  copt.max_key_bytes = 8;
  auto ep = r.await(connect(link_kind::loopback, copt));
  const auto x = ramp(4, 0.0f);
  std::error_code long_key, bad_shape;
  std::string long_key_why, bad_shape_why;
  auto produce = [&]() -> asio::awaitable<void> {
    auto a = ep.s.open_blob();
    long_key = co_await a.emit("a-key-longer-than-8", value::tensor(x));
    long_key_why = a.last_error();
    auto bad = value::tensor(x, {4}, "no_such_dtype");  // (no braced temporaries across co_await: GCC 12)
    bad_shape = co_await a.emit("x", std::move(bad));
    bad_shape_why = a.last_error();
    BLOBPIPE_CO_CHECK(a.emit("x", value::tensor(x)));
    BOOST_TEST(a.last_error().empty());  // a success clears it
    BLOBPIPE_CO_CHECK(a.finish());
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  auto consume = [&]() -> asio::awaitable<void> {
    while ((co_await ep.c.next()).kind != event_kind::end_of_stream) {
    }
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST((long_key == errc::invalid_argument), long_key.message());
  BOOST_TEST(long_key_why.find("max_key_bytes") != std::string::npos, long_key_why);
  BOOST_TEST(bool(bad_shape), bad_shape.message());
  BOOST_TEST(!bad_shape_why.empty());
}

// The consumer's max_entry_bytes reaches the sender in its hello: emit
// refuses a longer entry at once, before any byte is framed, and the blob
// and the connection go on (the consumer would refuse it mid-stream and
// close).
BOOST_AUTO_TEST_CASE(an_entry_over_the_consumers_max_entry_bytes_is_refused_at_emit) {
  for (link_kind l : {link_kind::loopback, link_kind::tcp}) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      consumer_options copt;
      copt.max_entry_bytes = 1024;
      auto ep = r.await(connect(l, copt));
      BOOST_TEST(ep.s.max_entry_bytes() == 1024u);
      const auto at_limit = ramp(256, 0.0f);  // 1024 bytes
      const auto over = ramp(257, 0.0f);      // 1028 bytes
      std::error_code refused;
      std::string why;
      std::size_t entries = 0, completed = 0;
      std::error_code ended;
      auto produce = [&]() -> asio::awaitable<void> {
        auto a = ep.s.open_blob();
        refused = co_await a.emit("over", value::tensor(over));
        why = a.last_error();
        BLOBPIPE_CO_CHECK(a.emit("at", value::tensor(at_limit)));
        BLOBPIPE_CO_CHECK(a.finish());
        BLOBPIPE_CO_CHECK(ep.s.shutdown());
      };
      auto consume = [&]() -> asio::awaitable<void> {
        for (;;) {
          auto ev = co_await ep.c.next();
          if (ev.kind == event_kind::end_of_stream) {
            ended = ev.error;
            break;
          }
          if (ev.kind == event_kind::entry_ready) ++entries;
          if (ev.kind == event_kind::blob_complete) ++completed;
        }
      };
      r.spawn(produce());
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((refused == errc::invalid_argument), refused.message());
      BOOST_TEST(why.find("1028 bytes, over the consumer's max_entry_bytes 1024") !=
                     std::string::npos,
                 why);
      BOOST_TEST(entries == 1u);
      BOOST_TEST(completed == 1u);
      BOOST_TEST(!ended, ended.message());
    }
  }
}

// Closing the sender fails a producer that waits for window credit, and
// later calls fail with closed.
BOOST_AUTO_TEST_CASE(sender_close_fails_waiting_producer) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      const auto x = ramp(1024, 0.0f);  // 4 KiB
      std::error_code waiting_ec, later_ec;
      bool waiting = false;
      std::shared_ptr<const received_entry> held;
      consumer_options copt;
      copt.window_bytes = 4096;
      copt.held_bytes = 0;  // the entry held keeps its window credit
      auto ep = r.await(connect(l, copt));
      auto produce = [&]() -> asio::awaitable<void> {
        auto blob = ep.s.open_blob();
        BLOBPIPE_CO_CHECK(blob.emit("x0", value::tensor(x)));
        waiting = true;
        waiting_ec = co_await blob.emit("x1", value::tensor(x));
        later_ec = co_await ep.s.open_blob().finish();
      };
      auto consume = [&]() -> asio::awaitable<void> {
        auto ev = co_await ep.c.next();
        held = ev.entry;  // never released: the producer must wait
        for (;;) {
          auto more = co_await ep.c.next();
          if (more.kind == event_kind::end_of_stream) break;
        }
      };
      auto closer = [&]() -> asio::awaitable<void> {
        while (!waiting) co_await yield_n(1);
        co_await yield_n(20);
        // x0 alone is outstanding: its bytes, key, its compact meta of one
        // dim, and bookkeeping.
        BOOST_TEST(ep.s.in_flight_bytes() == compact_entry_credit(4096, 2, 1));
        ep.s.close();
      };
      r.spawn(produce());
      r.spawn(consume());
      r.spawn(closer());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((waiting_ec == errc::closed));
      BOOST_TEST((later_ec == errc::closed));
    }
  }
}

// A sender assigned over closes the one it held, as destroying it does
// (producer.hpp sender: "destroying it, or assigning another sender over
// it, closes its connection"): the old consumer sees the blob left open
// aborted and its stream end, not a connection held open by the old
// sender's tasks until a timeout.
BOOST_AUTO_TEST_CASE(a_sender_assigned_over_closes_the_one_it_held) {
  runner r;
  std::vector<event> events;
  auto ep = r.await(connect(link_kind::loopback));
  auto produce = [&]() -> asio::awaitable<void> {
    auto w = ep.s.open_blob();
    BLOBPIPE_CO_CHECK(w.emit("x", value::tensor(ramp(10, 0.0f))));
    BLOBPIPE_CO_CHECK(ep.s.flush());
    ep.s = sender{};
  };
  r.spawn(produce());
  r.spawn(every_event(ep.c, events));
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(20)));
  BOOST_TEST_REQUIRE(!events.empty());
  BOOST_TEST((events.back().kind == event_kind::end_of_stream));
  bool aborted = false;
  for (const event& e : events) aborted |= e.kind == event_kind::blob_aborted && e.blob_id == 1;
  BOOST_TEST(aborted, "blob 1, left open, is reported aborted");
}

// A value's owner (value::owner) is let go once its blob is finished: the
// sender keeps the finished blob's emptied entry storage for the next blob
// (send_alloc_test), never the values planned in it.
BOOST_AUTO_TEST_CASE(a_finished_blob_lets_go_of_its_values_owners) {
  runner r;
  std::vector<event> events;
  auto ep = r.await(connect(link_kind::loopback));
  auto floats = std::make_shared<std::vector<float>>(ramp(64, 1.0f));
  const std::weak_ptr<std::vector<float>> watch = floats;
  bool held_after_finish = true;
  auto produce = [&]() -> asio::awaitable<void> {
    {
      value v = value::tensor(*floats);
      v.owner = std::move(floats);
      auto blob = ep.s.open_blob();
      BLOBPIPE_CO_CHECK(blob.emit("x", std::move(v)));
      BLOBPIPE_CO_CHECK(blob.finish());
    }
    held_after_finish = !watch.expired();
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  r.spawn(produce());
  r.spawn(every_event(ep.c, events));
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(20)));
  BOOST_TEST(!held_after_finish, "the sender still holds the value's owner after finish");
}

// A blob the file sink cannot take (file_slot_for fails) is aborted once,
// naming why, and none of its entries is yielded: its bytes are dropped as
// they come. The next blob is written as usual.
BOOST_AUTO_TEST_CASE(a_blob_the_file_sink_refuses_is_aborted_and_yields_none_of_its_entries) {
  runner r;
  char path[] = "/tmp/blobpipe_sink_XXXXXX";
  const int fd = ::mkstemp(path);
  BOOST_TEST_REQUIRE(fd >= 0);
  const auto refused = make_spec(1, 1);
  const auto kept = make_spec(2, 1);
  consumer_options copt;
  copt.assemble = assemble_mode::file;
  copt.file_slot_for = [&](std::uint64_t, const tag_t& tag) -> result<file_slot> {
    if (tag == refused.tag) return result<file_slot>(errc::too_large, "no room for this blob");
    return file_slot{fd, 0};
  };
  auto ep = r.await(connect(link_kind::tcp, copt));
  auto produce = [&]() -> asio::awaitable<void> {
    for (const blob_spec* spec : {&refused, &kept}) {
      auto blob = ep.s.open_blob(spec->tag);
      for (std::size_t e = 0; e < spec->keys.size(); ++e)
        BLOBPIPE_CO_CHECK(blob.emit(spec->keys[e], value::tensor(spec->data[e])));
      BLOBPIPE_CO_CHECK(blob.finish());
    }
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  int refused_entries = 0, refused_aborts = 0, kept_entries = 0, kept_completes = 0;
  std::string why;
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind == event_kind::end_of_stream) break;
      const bool of_refused = ev.tag == refused.tag;
      if (ev.kind == event_kind::entry_ready) ++(of_refused ? refused_entries : kept_entries);
      if (ev.kind == event_kind::blob_aborted && of_refused) {
        ++refused_aborts;
        why = ev.reason;
      }
      if (ev.kind == event_kind::blob_complete && !of_refused) ++kept_completes;
    }
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(refused_entries == 0);
  BOOST_TEST(refused_aborts == 1);
  BOOST_TEST(why.find("no room for this blob") != std::string::npos, why);
  BOOST_TEST(kept_entries == static_cast<int>(kept.keys.size()));
  BOOST_TEST(kept_completes == 1);
  ::close(fd);
  ::unlink(path);
}

// A file_slot whose writes fail (a full disk: /dev/full answers every write
// with ENOSPC) aborts the blob with io, naming pwrite's error, before any
// of its entries is yielded; the stream goes on.
BOOST_AUTO_TEST_CASE(a_blob_whose_file_writes_fail_is_aborted_with_io) {
  const int fd = ::open("/dev/full", O_WRONLY);
  if (fd < 0) BLOBPIPE_SKIP("/dev/full cannot be opened for writing here");
  runner r;
  const auto spec = make_spec(1, 2);
  consumer_options copt;
  copt.assemble = assemble_mode::file;
  copt.file_slot_for = [&](std::uint64_t, const tag_t&) -> result<file_slot> {
    return file_slot{fd, 0};
  };
  auto ep = r.await(connect(link_kind::tcp, copt));
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob(spec.tag);
    for (std::size_t e = 0; e < spec.keys.size(); ++e)
      BLOBPIPE_CO_CHECK(blob.emit(spec.keys[e], value::tensor(spec.data[e])));
    BLOBPIPE_CO_CHECK(blob.finish());
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  int entries = 0, aborts = 0, completes = 0;
  std::error_code error, end_error;
  std::string why;
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind == event_kind::end_of_stream) {
        end_error = ev.error;
        break;
      }
      if (ev.kind == event_kind::entry_ready) ++entries;
      if (ev.kind == event_kind::blob_complete) ++completes;
      if (ev.kind == event_kind::blob_aborted) {
        ++aborts;
        error = ev.error;
        why = ev.reason;
      }
    }
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(entries == 0);
  BOOST_TEST(completes == 0);
  BOOST_TEST(aborts == 1);
  BOOST_TEST((error == errc::io), error.message());
  BOOST_TEST(why.find("file sink: pwrite failed: ") != std::string::npos, why);
  BOOST_TEST(!end_error, end_error.message());
  ::close(fd);
}

// The file sink writes each blob at its offset; the file reads back with
// read_index_file and matches write(plan) byte for byte.
BOOST_AUTO_TEST_CASE(file_sink_writes_blob_at_its_offset) {
  runner r;
  char path[] = "/tmp/blobpipe_sink_XXXXXX";
  const int fd = ::mkstemp(path);
  BOOST_TEST_REQUIRE(fd >= 0);
  auto spec = make_spec(1, 2);
  const auto want = spec.expected();
  constexpr std::uint64_t base = 1000;  // unaligned on purpose, like a shard
  consumer_options copt;
  copt.assemble = assemble_mode::file;
  copt.file_slot_for = [&](std::uint64_t, const tag_t&) -> result<file_slot> {
    return file_slot{fd, base};
  };
  std::uint64_t nbytes = 0;
  auto ep = r.await(connect(link_kind::tcp, copt));
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob(spec.tag);
    for (std::size_t e = 0; e < spec.keys.size(); ++e)
      BLOBPIPE_CO_CHECK(blob.emit(spec.keys[e], value::tensor(spec.data[e])));
    BLOBPIPE_CO_CHECK(blob.finish());
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind == event_kind::end_of_stream) break;
      if (ev.kind == event_kind::blob_complete) {
        nbytes = ev.blob->nbytes;
        BOOST_TEST(ev.blob->file.offset == base);
      }
    }
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST_REQUIRE(nbytes == want.size());
  std::vector<std::byte> got(want.size());
  BOOST_TEST_REQUIRE(::pread(fd, got.data(), got.size(), base) == static_cast<ssize_t>(got.size()));
  BOOST_TEST((got == want));
  auto idx = read_index_file(path, base, nbytes);
  BOOST_TEST_REQUIRE(idx.has_value(), idx.message());
  BOOST_TEST(idx->entries.size() == spec.keys.size());
  BOOST_TEST((idx->foot.tag == spec.tag));
  ::close(fd);
  ::unlink(path);
}

// ---- a consumer that is not blobpipe's: its close reason, its window -------

namespace {

/// The hello a consumer would answer `offer` with, granting `window` bytes
/// and accepting no feature (no credit grants: the window is all there is).
hello consumer_reply(const hello& offer, std::uint64_t window) {
  hello r{.role = wire_role::consumer};
  r.max_chunk_bytes = offer.max_chunk_bytes;
  r.inline_bytes = offer.inline_bytes;
  r.window_bytes = window;
  return r;
}

std::span<const std::byte> bytes_of(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

/// Plays a consumer on `t`: answers the sender's hello granting `window`
/// bytes, then reads frames until one of type `until` arrives, then sends
/// a close frame with `reason` and closes (`until` hello: answers and
/// returns at once, leaving `t` open and unread).
asio::awaitable<void> scripted_consumer(transport& t, std::uint64_t window, frame_type until,
                                        std::string reason) {
  frame_reader in;
  auto [ec, f] = co_await in.next(t);
  BOOST_TEST_REQUIRE(!ec, "reading the sender's hello: " << ec.message());
  auto offer = decode_hello(f.payload);
  BOOST_TEST_REQUIRE(offer.has_value());
  (void)co_await send_frame(t, {.type = frame_type::hello}, encode_hello(consumer_reply(*offer, window)));
  if (until == frame_type::hello) co_return;
  for (;;) {
    auto [rec, g] = co_await in.next(t);
    if (rec) co_return;
    if (g.header.type == until) break;
  }
  (void)co_await send_frame(t, {.type = frame_type::close}, bytes_of(reason));
  t.close();
}

}  // namespace

// A consumer that refuses the stream says why in its close frame
// (docs/wire.md "Closing"); the sender's error is peer_closed and its
// failure_reason(), and the last_error() of an emit refused afterwards,
// carry that reason (escaped: the peer's own words).
BOOST_AUTO_TEST_CASE(a_consumers_close_reason_reaches_the_senders_error) {
  for (link_kind l : {link_kind::loopback, link_kind::tcp}) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      const std::string reason = "entry 'x' of 4096 bytes is over max_entry_bytes (16)\nOK";
      r.spawn(scripted_consumer(*b, 1u << 20, frame_type::entry_begin, reason));
      std::error_code first_ec, later_ec;
      std::string later_why;
      sender snd;
      auto produce = [&]() -> asio::awaitable<void> {
        auto [sec, s] = co_await sender::start(std::move(a));
        BOOST_TEST_REQUIRE(!sec, sec.message());
        snd = std::move(s);
        auto w = snd.open_blob();
        const auto x = ramp(1024, 0.0f);
        for (int i = 0; i < 1000 && !first_ec; ++i) {
          first_ec = co_await w.emit("x" + std::to_string(i), value::tensor(x));
          if (!first_ec) first_ec = co_await snd.flush();
        }
        later_ec = co_await w.emit("y", value::tensor(x));
        later_why = w.last_error();
      };
      r.spawn(produce());
      BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
      BOOST_TEST((first_ec == errc::peer_closed), first_ec.message());
      BOOST_TEST((snd.error() == errc::peer_closed), snd.error().message());
      const std::string escaped = "the consumer closed the stream: " + escape(reason);
      BOOST_TEST(snd.failure_reason() == escaped);
      BOOST_TEST((later_ec == errc::peer_closed), later_ec.message());
      BOOST_TEST(later_why.find(escaped) != std::string::npos, later_why);
    }
  }
}

// After the sender's own close, a consumer closing its end is the orderly
// end, and so is a close frame without words; a close frame with a reason
// is a refusal (something sent was not taken): shutdown() fails with
// peer_closed and the reason.
BOOST_AUTO_TEST_CASE(a_close_with_a_reason_after_the_senders_close_fails_shutdown) {
  for (const std::string& reason : {std::string("blob 1 refused: too many entries"), std::string()}) {
    BOOST_TEST_CONTEXT("reason '" << reason << "'") {
      runner r;
      auto [a, b] = r.await(raw_pair(link_kind::loopback));
      r.spawn(scripted_consumer(*b, 1u << 20, frame_type::close, reason));
      std::error_code shut;
      sender snd;
      std::uint64_t running_before = 0, running_after = 0;
      auto produce = [&]() -> asio::awaitable<void> {
        auto [sec, s] = co_await sender::start(std::move(a));
        BOOST_TEST_REQUIRE(!sec, sec.message());
        snd = std::move(s);
        auto w = snd.open_blob();
        BLOBPIPE_CO_CHECK(w.emit("x", value::tensor(ramp(8, 0.0f))));
        BLOBPIPE_CO_CHECK(w.finish());
        running_before = snd.stats().tasks_running;
        shut = co_await snd.shutdown();
        running_after = snd.stats().tasks_running;
      };
      r.spawn(produce());
      BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
      // shutdown() returns once the sender's own tasks have ended, in
      // order or refused.
      BOOST_TEST(running_before > 0u);
      BOOST_TEST(running_after == 0u, "a task of the sender outlived shutdown()");
      if (reason.empty()) {
        BOOST_TEST(!shut, shut.message());
      } else {
        BOOST_TEST((shut == errc::peer_closed), shut.message());
        BOOST_TEST(snd.failure_reason() == "the consumer closed the stream: " + reason);
      }
    }
  }
}

// shutdown() after close() (a sender failed by its owner, or by the peer,
// the moment before) still waits for the sender's tasks: they are ending,
// not ended, when close() returns.
BOOST_AUTO_TEST_CASE(shutdown_of_a_failed_sender_ends_its_tasks) {
  runner r;
  auto [a, b] = r.await(raw_pair(link_kind::loopback));
  r.spawn(scripted_consumer(*b, 1u << 20, frame_type::hello, ""));
  std::error_code shut;
  std::uint64_t running_before = 0, running_after = 1;
  auto produce = [&]() -> asio::awaitable<void> {
    auto [sec, snd] = co_await sender::start(std::move(a));
    BOOST_TEST_REQUIRE(!sec, sec.message());
    snd.close();
    running_before = snd.stats().tasks_running;
    shut = co_await snd.shutdown();
    running_after = snd.stats().tasks_running;
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
  BOOST_TEST((shut == errc::closed), shut.message());
  BOOST_TEST(running_before > 0u);  // still ending when close() returned
  BOOST_TEST(running_after == 0u, "a task of the failed sender outlived shutdown()");
}

namespace {

/// A transport that says when it is destroyed (the sender let it go).
class watched_transport final : public forwarding_transport {
 public:
  watched_transport(std::unique_ptr<transport> inner, std::shared_ptr<bool> gone)
      : forwarding_transport(std::move(inner)), gone_(std::move(gone)) {}
  ~watched_transport() override { *gone_ = true; }

 private:
  std::shared_ptr<bool> gone_;
};

}  // namespace

// A failed sender holds no closed transport: one whose start failed lets
// it go at once, and one that failed later once shutdown() has ended its
// tasks, while the sender object (its error, failure_reason) lives on.
BOOST_AUTO_TEST_CASE(a_failed_sender_releases_its_transport) {
  for (const bool failed_start : {true, false}) {
    BOOST_TEST_CONTEXT((failed_start ? "failed start" : "failed later")) {
      runner r;
      auto [a, b] = r.await(raw_pair(link_kind::loopback));
      auto gone = std::make_shared<bool>(false);
      auto watched = std::make_unique<watched_transport>(std::move(a), gone);
      // A window of 0 without credit grants: the sender refuses the hello.
      r.spawn(scripted_consumer(*b, failed_start ? 0 : 1u << 20, frame_type::hello, ""));
      std::error_code started, shut;
      bool gone_while_alive = false;
      auto produce = [&]() -> asio::awaitable<void> {
        auto [sec, snd] = co_await sender::start(std::move(watched));
        started = sec;
        if (!sec) {
          snd.close();
          shut = co_await snd.shutdown();
        }
        gone_while_alive = *gone;  // `snd` is still in scope
      };
      r.spawn(produce());
      BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
      BOOST_TEST(bool(started) == failed_start, started.message());
      BOOST_TEST(gone_while_alive, "the failed sender still holds its transport");
    }
  }
}

namespace {

/// A sender over TCP to a consumer that grants a window of 2^64 - 1 and
/// then reads nothing (nor closes), with the sender's own bound
/// `max_queued` and a stall_timeout. `produce(snd)` runs against it; the
/// sender's stats and error afterwards.
struct unread_run {
  sender_stats stats;
  std::error_code error;
  std::string reason;
  std::error_code shutdown_ec;       // shutdown() of the failed sender
  std::uint64_t tasks_after = 1;     // its tasks running once shutdown() returned
};

template <class Produce>
unread_run against_a_consumer_that_reads_nothing(std::size_t max_queued, Produce produce) {
  runner r;
  auto [a, b] = r.await(raw_pair(link_kind::tcp));
  r.spawn(scripted_consumer(*b, ~std::uint64_t{0}, frame_type::hello, ""));
  unread_run out;
  auto run = [&]() -> asio::awaitable<void> {
    sender_options opt;
    opt.max_queued_bytes = max_queued;
    opt.stall_timeout = std::chrono::milliseconds(300);
    auto [sec, snd] = co_await sender::start(std::move(a), opt);
    BOOST_TEST_REQUIRE(!sec, sec.message());
    BOOST_TEST_REQUIRE(snd.window_bytes() == ~std::uint64_t{0});
    co_await produce(snd);
    out.stats = snd.stats();
    out.error = snd.error();
    out.reason = snd.failure_reason();
    out.shutdown_ec = co_await snd.shutdown();
    out.tasks_after = snd.stats().tasks_running;
  };
  r.spawn(run());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(60)));
  return out;
}

}  // namespace

// The sender's memory has a bound of its own, whatever window the consumer
// grants (sender_options::max_queued_bytes): against a consumer that grants
// 2^64 - 1 and reads nothing, copied entries, and blobs ended in a loop
// (a tail each), wait for the writer instead of growing the queue, and the
// stall clock ends the wait with timed_out instead of a hang.
BOOST_AUTO_TEST_CASE(the_sender_bounds_its_own_queue_whatever_window_the_consumer_grants) {
  constexpr std::size_t max_queued = 64 << 10;
  // Beyond the bound: one more item in the producers' outbox and in the
  // one being written (a 1 KiB entry or an empty blob, and its headers).
  constexpr std::uint64_t bound = 2 * (max_queued + 2048);
  constexpr int cap = 64 << 10;  // 64 MiB of entries: far past the kernel's buffers
  const auto x = ramp(256, 1.0f);  // 1 KiB: copied into its entry_begin
  std::error_code emit_ec;
  auto entries = against_a_consumer_that_reads_nothing(max_queued, [&](sender& snd) -> asio::awaitable<void> {
    auto w = snd.open_blob();
    for (int i = 0; i < cap && !emit_ec; ++i) emit_ec = co_await w.emit("x" + std::to_string(i), value::tensor(x));
  });
  BOOST_TEST((emit_ec == errc::timed_out), emit_ec.message());
  BOOST_TEST((entries.error == errc::timed_out), entries.error.message());
  BOOST_TEST(entries.reason.find("(stall_timeout)") != std::string::npos, entries.reason);
  BOOST_TEST(entries.stats.entries_sent < std::uint64_t{cap});
  BOOST_TEST(entries.stats.queued_high_water > max_queued);  // it did fill up
  BOOST_TEST(entries.stats.queued_high_water <= bound);
  // shutdown() of a sender that failed before still ends its tasks.
  BOOST_TEST((entries.shutdown_ec == errc::timed_out), entries.shutdown_ec.message());
  BOOST_TEST(entries.tasks_after == 0u, "a task of the failed sender outlived shutdown()");

  std::error_code finish_ec;
  auto blobs = against_a_consumer_that_reads_nothing(max_queued, [&](sender& snd) -> asio::awaitable<void> {
    for (int i = 0; i < cap * 4 && !finish_ec; ++i) finish_ec = co_await snd.open_blob().finish();
  });
  BOOST_TEST((finish_ec == errc::timed_out), finish_ec.message());
  BOOST_TEST(blobs.stats.blobs_sent < std::uint64_t{cap} * 4);
  BOOST_TEST(blobs.stats.queued_high_water > max_queued);
  BOOST_TEST(blobs.stats.queued_high_water <= bound);
}
