// _blobpipe._cpp_stream_bench: the C++ pipeline alone, for bench/python_bench.py
// to compare the Python classes with in the same run and process.
//
// A C++ sender on one thread streams `blobs` blobs of `per_blob` entries of
// `entry_bytes` bytes (uint8 views of one reused buffer) over TCP loopback
// to a C++ consumer on another, which drops each entry as it arrives: what
// bench/pipeline_bench.cpp's sections [1] and [2] do, with the sizes given.
// Returns the seconds from the first emit to the last blob_complete. The
// GIL is released throughout.
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "blobpipe/transport/tcp.hpp"
#include "stream.hpp"

namespace blobpipe::python {
namespace {

using clock_type = std::chrono::steady_clock;

void check(std::error_code ec, const char* what) {
  if (ec) throw std::runtime_error(std::string(what) + ": " + errc_name(ec));
}

double run(std::size_t blobs, std::size_t per_blob, std::size_t entry_bytes) {
  std::vector<std::byte> src(std::max<std::size_t>(entry_bytes, 1));
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 131 + 7);
  asio::io_context rx, tx;
  auto l = tcp::listen(rx.get_executor(), 0).value();
  clock_type::time_point start, end;
  std::exception_ptr rx_error, tx_error;
  asio::co_spawn(
      rx,
      [&]() -> asio::awaitable<void> {
        auto [ec, t] = co_await l.accept();
        check(ec, "accept");
        auto [ec2, c] = co_await consumer::start(std::move(t));
        check(ec2, "consumer::start");
        for (;;) {
          event ev = co_await c.next();
          if (ev.kind == event_kind::blob_complete) end = clock_type::now();
          if (ev.kind == event_kind::blob_aborted) throw std::runtime_error("blob aborted");
          if (ev.kind == event_kind::end_of_stream) {
            check(ev.error, "end of stream");
            co_return;
          }
        }
      },
      [&](std::exception_ptr e) { rx_error = e; });
  asio::co_spawn(
      tx,
      [&]() -> asio::awaitable<void> {
        auto [ec, t] = co_await tcp::connect(tx.get_executor(), "127.0.0.1", l.port());
        check(ec, "connect");
        auto [ec2, s] = co_await sender::start(std::move(t));
        check(ec2, "sender::start");
        const value v = value::tensor_bytes(std::span(src).first(entry_bytes), "uint8",
                                            {static_cast<std::int64_t>(entry_bytes)});
        start = clock_type::now();
        for (std::size_t b = 0; b < blobs; ++b) {
          auto blob = s.open_blob();
          for (std::size_t i = 0; i < per_blob; ++i)
            check(co_await blob.emit("e" + std::to_string(i), v), "emit");
          check(co_await blob.finish(), "finish");
        }
        check(co_await s.shutdown(), "shutdown");
      },
      [&](std::exception_ptr e) { tx_error = e; });
  std::thread rx_thread([&] { rx.run(); });
  tx.run();
  rx_thread.join();
  if (tx_error) std::rethrow_exception(tx_error);
  if (rx_error) std::rethrow_exception(rx_error);
  return std::chrono::duration<double>(end - start).count();
}

}  // namespace

void init_stream_bench(py::module_& m) {
  m.def(
      "_cpp_stream_bench",
      [](std::size_t blobs, std::size_t per_blob, std::size_t entry_bytes) {
        py::gil_scoped_release nogil;
        return run(blobs, per_blob, entry_bytes);
      },
      py::arg("blobs"), py::arg("per_blob"), py::arg("entry_bytes"),
      "Seconds for the C++ pipeline alone to stream blobs x per_blob entries of entry_bytes "
      "bytes over TCP loopback (sender and consumer on two threads). For the benchmark.");
}

}  // namespace blobpipe::python
