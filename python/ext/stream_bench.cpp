// _blobpipe._cpp_stream_send / _cpp_stream_consume: the C++ pipeline alone,
// one half each, for bench/python_stream.py to run in two processes and
// compare with the Python classes doing the same in the same run.
//
// The sender connects over TCP, then streams `blobs` blobs, each the given
// entries in order (keys, kinds, dtypes, shapes and bytes as Python passed
// them, borrowed for the call), and shuts down; the consumer listens on
// 127.0.0.1, accepts one sender and drops each entry as it arrives. Times
// are CLOCK_MONOTONIC seconds (std::chrono::steady_clock, Python's
// time.monotonic()), which two processes on one host share: the bench takes
// the consumer's last blob_complete minus the sender's first emit. The GIL
// is released while either half runs.
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <pybind11/stl.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <vector>

#include "blobpipe/transport/tcp.hpp"
#include "buffer.hpp"
#include "stream.hpp"

namespace blobpipe::python {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds(clock_type::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

void check(std::error_code ec, const char* what) {
  if (ec) throw std::runtime_error(std::string(what) + ": " + errc_name(ec));
}

// Runs `body` to completion on a fresh io_context on this thread;
// rethrows what it threw.
template <class Body>
void run_alone(Body body) {
  asio::io_context io;
  std::exception_ptr error;
  asio::co_spawn(io, body(io.get_executor()), [&](std::exception_ptr e) { error = e; });
  io.run();
  if (error) std::rethrow_exception(error);
}

/// (key, value) for one entry of every blob the sender streams.
struct bench_entry {
  std::string key;
  value v;
};

double send(std::uint16_t port, std::size_t blobs, const std::vector<bench_entry>& entries) {
  clock_type::time_point start;
  run_alone([&](asio::any_io_executor ex) -> asio::awaitable<void> {
    auto [ec, t] = co_await tcp::connect(ex, "127.0.0.1", port);
    check(ec, "connect");
    auto [ec2, s] = co_await sender::start(std::move(t));
    check(ec2, "sender::start");
    start = clock_type::now();
    for (std::size_t b = 0; b < blobs; ++b) {
      auto blob = s.open_blob();
      for (const bench_entry& e : entries) check(co_await blob.emit(e.key, e.v), "emit");
      check(co_await blob.finish(), "finish");
    }
    check(co_await s.shutdown(), "shutdown");
  });
  return seconds(start);
}

struct consumed {
  std::uint64_t entries = 0, blobs = 0;
  double end = 0;  // the last blob_complete, monotonic seconds
};

consumed consume(const std::function<void(std::uint16_t)>& on_port) {
  consumed out;
  run_alone([&](asio::any_io_executor ex) -> asio::awaitable<void> {
    auto l = tcp::listen(ex, 0, "127.0.0.1").value();
    on_port(l.port());
    auto [ec, t] = co_await l.accept();
    check(ec, "accept");
    auto [ec2, c] = co_await consumer::start(std::move(t));
    check(ec2, "consumer::start");
    for (;;) {
      event ev = co_await c.next();
      switch (ev.kind) {
        case event_kind::entry_ready: ++out.entries; break;
        case event_kind::blob_complete:
          ++out.blobs;
          out.end = seconds(clock_type::now());
          break;
        case event_kind::blob_aborted: throw std::runtime_error("blob aborted");
        case event_kind::end_of_stream: check(ev.error, "end of stream"); co_return;
      }
    }
  });
  return out;
}

}  // namespace

void init_stream_bench(py::module_& m) {
  m.def(
      "_cpp_stream_send",
      [](std::uint16_t port, std::size_t blobs, py::list spec) {
        // Held for the call: the bytes are borrowed by the values.
        std::vector<std::unique_ptr<held_buffer>> held;
        std::vector<bench_entry> entries;
        for (py::handle row : spec) {
          auto [key, kind, dtype, shape, data] =
              py::cast<std::tuple<std::string, std::string, std::string,
                                 std::vector<std::int64_t>, py::object>>(row);
          held.push_back(std::make_unique<held_buffer>(data, false));
          const std::span<const std::byte> b = held.back()->bytes();
          entries.push_back({key, kind == "p"   ? value::pickle(b)
                                  : kind == "n" ? value::ndarray_bytes(b, dtype, shape)
                                                : value::tensor_bytes(b, dtype, shape)});
        }
        gil_released nogil;
        return send(port, blobs, entries);
      },
      py::arg("port"), py::arg("blobs"), py::arg("entries"),
      "The C++ sender half of bench/python_stream.py: connects to 127.0.0.1:port and streams "
      "`blobs` blobs of `entries` ((key, kind, dtype, shape, bytes-like) each). Returns the "
      "first emit's time, time.monotonic() seconds.");
  m.def(
      "_cpp_stream_consume",
      [](py::function on_port) {
        consumed c;
        {
          gil_released nogil;
          c = consume([&](std::uint16_t port) {
            py::gil_scoped_acquire gil;
            on_port(port);
          });
        }
        return py::make_tuple(c.entries, c.blobs, c.end);
      },
      py::arg("on_port"),
      "The C++ consumer half of bench/python_stream.py: listens on 127.0.0.1 (a free port, "
      "passed to on_port), accepts one sender and drops every entry until its end of stream. "
      "Returns (entries, blobs, the last blob_complete's time.monotonic() seconds).");
}

}  // namespace blobpipe::python
