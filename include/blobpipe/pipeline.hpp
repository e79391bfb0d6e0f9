// blobpipe/pipeline.hpp — the streaming pipeline in one include.
//
// Producers emit (key, value) pairs into blobs (producer.hpp); each entry
// goes out as soon as it is emitted, over a frame transport (transport.hpp:
// tcp.hpp, loopback.hpp) speaking the protocol of docs/wire.md (wire.hpp);
// the consumer yields entries as they complete and checks each blob's tail
// (consumer.hpp).
//
//   // trainer                                   // rollout worker
//   auto l = blobpipe::tcp::listen(ex, 5555).value();
//   auto [e1, t] = co_await l.accept();          auto [e1, t] = co_await blobpipe::tcp::connect(ex, host, 5555);
//   auto [e2, c] = co_await                      auto [e2, s] = co_await blobpipe::sender::start(std::move(t));
//       blobpipe::consumer::start(std::move(t)); auto b = s.open_blob();
//   auto ev = co_await c.next();                 co_await b.emit("x", blobpipe::value::tensor(x));
//                                                co_await b.finish();
//
// Source: docs/wire.md.
#pragma once

#include "blobpipe/pipeline/consumer.hpp"
#include "blobpipe/pipeline/delivery.hpp"
#include "blobpipe/format.hpp"
#include "blobpipe/transport/loopback.hpp"
#include "blobpipe/pipeline/producer.hpp"
#include "blobpipe/transport/tcp.hpp"
#include "blobpipe/transport/transport.hpp"
#include "blobpipe/protocol/wire.hpp"
