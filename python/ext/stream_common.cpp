// completion, raise_code and the option parsers of stream.hpp.
#include <limits>
#include <string_view>

#include "errors.hpp"
#include "stream.hpp"

namespace blobpipe::python {
namespace py = pybind11;

namespace {

// numpy's bool scalar: operator.index takes it (deprecated), as no count.
bool numpy_bool(py::handle v) {
  const std::string_view type = Py_TYPE(v.ptr())->tp_name;
  return type == "numpy.bool_" || type == "numpy.bool";
}

// A non-negative int option within [lo, hi]: an int or any integer
// (operator.index: numpy's too), not a bool (Python's or numpy's).
std::uint64_t uint_option(py::handle v, const std::string& name, std::uint64_t lo,
                          std::uint64_t hi) {
  if (!PyIndex_Check(v.ptr()) || PyBool_Check(v.ptr()) || numpy_bool(v))
    throw py::type_error(name + " must be an int (bytes or a count), not " +
                         std::string(py::str(py::type::handle_of(v).attr("__name__"))));
  const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  const unsigned long long x = PyLong_AsUnsignedLongLong(i.ptr());
  if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();  // negative, or above 2**64 - 1
    throw py::value_error(name + " must be within " + std::to_string(lo) + ".." +
                          std::to_string(hi) + ", not " + std::string(py::repr(v)));
  }
  if (x < lo || x > hi)
    throw py::value_error(name + " must be within " + std::to_string(lo) + ".." +
                          std::to_string(hi) + ", not " + std::to_string(x));
  return x;
}

template <class T>
T sized(py::handle v, const std::string& name, std::uint64_t lo = 0) {
  return static_cast<T>(uint_option(v, name, lo, std::numeric_limits<T>::max()));
}

// An option's name: a dict given as options may hold keys of any type.
std::string option_name(py::handle k) {
  if (!PyUnicode_Check(k.ptr()))
    throw py::type_error("option names are str, not " +
                         std::string(py::str(py::type::handle_of(k).attr("__name__"))));
  return py::cast<std::string>(k);
}

bool flag(py::handle v, const std::string& name) {
  if (!PyBool_Check(v.ptr())) throw py::type_error(name + " must be True or False");
  return v.ptr() == Py_True;
}

[[noreturn]] void unknown(const std::string& name, const char* what) {
  throw py::type_error(std::string("unexpected ") + what + " option '" + name + "'");
}

}  // namespace

bool completion::set(std::error_code ec, std::string message) {
  {
    std::lock_guard lk(mu_);
    if (done_) return false;
    done_ = true;
    ec_ = ec;
    message_ = std::move(message);
  }
  cv_.notify_all();
  return true;
}

bool completion::wait(std::optional<std::chrono::steady_clock::time_point> deadline) {
  return wait_interruptibly(mu_, cv_, [this] { return done_; }, deadline);
}

void completion::wait_nogil() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [this] { return done_; });
}

std::error_code completion::code() const {
  std::lock_guard lk(mu_);
  return ec_;
}

std::string completion::message() const {
  std::lock_guard lk(mu_);
  return message_;
}

void completion::raise_if_failed(const std::string& what) const {
  std::error_code ec;
  std::string message;
  {
    std::lock_guard lk(mu_);
    ec = ec_;
    message = message_;
  }
  if (!ec) return;
  raise_code(ec, what + (message.empty() ? ec.message() : message));
}

void raise_code(std::error_code ec, const std::string& message) {
  raise(error{ec, message.empty() ? ec.message() : message});
}

sender_settings sender_settings_from(const py::dict& kw) {
  sender_settings s;
  sender_options& o = s.opt;
  std::string resend_only;  // the first resend session limit given
  for (auto [k, v] : kw) {
    const std::string name = option_name(k);
    if (name == "chunk_bytes") {
      o.chunk_bytes = sized<std::uint32_t>(v, name, min_chunk_bytes);
    } else if (name == "inline_bytes") {
      o.inline_bytes =
          static_cast<std::uint32_t>(uint_option(v, name, 0, max_inline_bytes));
    } else if (name == "max_queued_bytes") {
      o.max_queued_bytes = sized<std::size_t>(v, name, 1);
    } else if (name == "queue_bytes") {
      // 0 is how the default is kept internally, never a value to pass.
      s.queue_bytes = sized<std::uint64_t>(v, name);
      if (s.queue_bytes == 0)
        throw py::value_error("queue_bytes must be at least 1 byte, not 0 (leave it out for the "
                              "default: the consumer's window, at most 64 MiB)");
      if (s.queue_bytes > max_queue_bytes)
        throw py::value_error("queue_bytes must be at most " + std::to_string(max_queue_bytes) +
                              " bytes (64 MiB), not " + std::to_string(s.queue_bytes));
    } else if (name == "stall_timeout") {
      o.stall_timeout = timeout_ms(v, "stall_timeout");
    } else if (name == "handshake_timeout") {
      o.handshake_timeout = timeout_ms(v, "handshake_timeout");
    } else if (name == "resend") {
      s.resend = flag(v, name);
    } else if (name == "unacked_bytes") {
      o.resend.unacked_bytes = sized<std::uint64_t>(v, name, 1);
      if (resend_only.empty()) resend_only = name;
    } else if (name == "max_attempts") {
      o.resend.max_attempts = sized<std::uint32_t>(v, name, 1);
      if (resend_only.empty()) resend_only = name;
    } else if (name == "retry_delay") {
      o.resend.retry_delay = timeout_ms(v, "retry_delay");
      if (resend_only.empty()) resend_only = name;
    } else if (name == "max_retry_delay") {
      o.resend.max_retry_delay = timeout_ms(v, "max_retry_delay");
      if (resend_only.empty()) resend_only = name;
    } else {
      unknown(name, "Sender");
    }
  }
  // A limit the plain sender would ignore: the caller meant a resend session.
  if (!resend_only.empty() && !s.resend)
    throw py::value_error(resend_only + " applies to resend sessions only: pass resend=True with it");
  return s;
}

consumer_settings consumer_settings_from(const py::dict& kw) {
  consumer_settings s;
  consumer_options& o = s.opt;
  // The application's waits are the Python iteration's, not the io
  // thread's, which reads ahead (consumer.cpp).
  o.waits_reported = true;
  for (auto [k, v] : kw) {
    const std::string name = option_name(k);
    if (name == "window_bytes") {
      o.window_bytes = sized<std::uint64_t>(v, name, 1);
    } else if (name == "max_chunk_bytes") {
      o.max_chunk_bytes = sized<std::uint32_t>(v, name, min_chunk_bytes);
    } else if (name == "inline_bytes") {
      o.inline_bytes = static_cast<std::uint32_t>(uint_option(v, name, 0, max_inline_bytes));
    } else if (name == "max_key_bytes") {
      o.max_key_bytes = sized<std::uint32_t>(v, name, 1);
    } else if (name == "max_meta_bytes") {
      o.max_meta_bytes = sized<std::uint32_t>(v, name, 1);
    } else if (name == "max_entry_bytes") {
      o.max_entry_bytes = sized<std::uint64_t>(v, name);
    } else if (name == "max_tail_bytes") {
      o.max_tail_bytes = sized<std::uint32_t>(v, name, 1);
    } else if (name == "max_blob_bytes") {
      o.max_blob_bytes = sized<std::uint64_t>(v, name, 1);
    } else if (name == "max_open_blobs") {
      o.max_open_blobs = sized<std::uint32_t>(v, name, 1);
    } else if (name == "max_entries_per_blob") {
      o.max_entries_per_blob = sized<std::uint64_t>(v, name, 1);
    } else if (name == "payload_window") {
      o.payload_window = sized<std::size_t>(v, name, 1);
    } else if (name == "recycle_bytes") {
      o.recycle_bytes = sized<std::uint64_t>(v, name);
    } else if (name == "stall_timeout") {
      o.stall_timeout = timeout_ms(v, "stall_timeout");
    } else if (name == "idle_timeout") {
      o.idle_timeout = timeout_ms(v, "idle_timeout");
    } else if (name == "held_bytes") {
      o.held_bytes = sized<std::uint64_t>(v, name);
    } else if (name == "held_timeout") {
      o.held_timeout = timeout_ms(v, "held_timeout");
    } else if (name == "handshake_timeout") {
      o.handshake_timeout = timeout_ms(v, "handshake_timeout");
    } else if (name == "allow_pickle") {
      s.allow_pickle = flag(v, name);
    } else {
      unknown(name, "Consumer");
    }
  }
  return s;
}

}  // namespace blobpipe::python
