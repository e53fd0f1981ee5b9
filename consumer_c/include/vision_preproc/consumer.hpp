// vision_preproc's consumer in C++: RAII over the C library (consumer.h). A Consumer owns
// the connection and the mapped blocks; a Frame owns one acquired tensor and gives its
// block back when it goes out of scope (or at release()). Boxes back to source pixels:
// vp::to_source(values, frame.item(i)) (boxes.hpp).
//
//     vp::Consumer consumer(vp::Consumer::find_socket(), "my_detector");
//     while (auto frame = consumer.next(std::chrono::seconds(1))) {   // the socket's signal
//         const float *x = frame->host<float>();     // host memory, in place (CUDA: frame->device_ptr())
//         ... run the network; frame's destructor gives the block back ...
//     }
//
// A node of protocol version 1 (consumer.protocol() == 1) sends no descriptors: build each
// vp::Tensor from your TensorRef subscription's message with vp::Tensor::from_msg(msg) and
// consumer.acquire(tensor).
#ifndef VISION_PREPROC_CONSUMER_HPP
#define VISION_PREPROC_CONSUMER_HPP

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "vision_preproc/boxes.hpp"
#include "vision_preproc/consumer.h"

namespace vp {

// A failure of the library (the message says what, and the fix where there is one).
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A tensor's descriptor (the C struct, with helpers).
struct Tensor : vp_tensor {
    Tensor() : vp_tensor() {}
    // From a TensorRef message of any ROS 2 client library (rclcpp's
    // vision_preproc_msgs::msg::TensorRef): the fields acquire needs and the items' geometry.
    template <typename Msg>
    static Tensor from_msg(const Msg &m) {
        Tensor t;
        vp_tensor_from_fields(&t, m.block_index, m.generation, m.memory_kind, m.byte_offset, m.byte_size,
                              m.ipc_event_handle.data(), static_cast<uint32_t>(m.ipc_event_handle.size()));
        t.stamp_ns = static_cast<int64_t>(m.header.stamp.sec) * 1000000000LL + m.header.stamp.nanosec;
        t.generation = m.generation;
        t.device_id = m.device_id;
        std::memcpy(t.device_uuid, m.device_uuid.data(), 16);
        t.ndim = static_cast<uint32_t>(std::min<size_t>(m.shape.size(), VP_MAX_DIMS));
        for (uint32_t i = 0; i < t.ndim; i++) t.shape[i] = m.shape[i];
        t.nitems = static_cast<uint32_t>(std::min<size_t>(m.items.size(), VP_MAX_ITEMS));
        for (uint32_t i = 0; i < t.nitems; i++) {
            t.items[i].valid = m.items[i].valid;
            t.items[i].source_width = m.items[i].source_width;
            t.items[i].source_height = m.items[i].source_height;
            t.items[i].geometry = geometry_of(m.items[i]);
        }
        return t;
    }
    // The geometry of batch slot i, for vp::to_source (throws for a stale item).
    const vp_geometry &item(uint32_t i = 0) const {
        if (i >= nitems) throw Error("vp::Tensor::item: no item " + std::to_string(i));
        if (!items[i].valid) throw Error("vp::Tensor::item: item " + std::to_string(i) + " is not valid (a stale "
                                         "camera): ignore its slot's outputs");
        return items[i].geometry;
    }
    size_t elements() const {
        size_t n = 1;
        for (uint32_t i = 0; i < ndim; i++) n *= shape[i];
        return n;
    }
};

class Consumer;

// An acquired tensor: its block is held until release() or the destructor.
class Frame {
  public:
    Frame(const Frame &) = delete;
    Frame &operator=(const Frame &) = delete;
    Frame(Frame &&o) noexcept : c_(o.c_), t_(o.t_) { o.c_ = nullptr; }
    Frame &operator=(Frame &&o) noexcept {
        if (this != &o) {
            if (c_) vp_release(c_, &t_, nullptr);
            c_ = o.c_, t_ = o.t_, o.c_ = nullptr;
        }
        return *this;
    }
    // Gives the block back (an error of the CUDA synchronization is dropped here: call
    // release() to see it).
    ~Frame() {
        if (c_) vp_release(c_, &t_, nullptr);
    }
    const Tensor &tensor() const { return t_; }
    const vp_geometry &item(uint32_t i = 0) const { return t_.item(i); }
    // Host memory: the tensor's first element (nullptr for CUDA memory).
    template <typename T = void>
    const T *host() const { return static_cast<const T *>(vp_host_data(c_, &t_)); }
    // CUDA memory: the tensor's device address in this process (0 for host memory).
    uint64_t device_ptr() const { return vp_device_ptr(c_, &t_); }
    // Give the block back; CUDA memory: after `cuda_stream` (nullptr: the whole context).
    void release(void *cuda_stream = nullptr) {
        if (c_ && vp_release(c_, &t_, cuda_stream) != VP_OK) {
            c_ = nullptr;
            throw Error(vp_last_error());
        }
        c_ = nullptr;
    }

  private:
    friend class Consumer;
    Frame(vp_consumer *c, const Tensor &t) : c_(c), t_(t) {}
    vp_consumer *c_;
    Tensor t_;
};

class Consumer {
  public:
    // Connect to the pool socket (a TensorRef's socket_path, or find_socket()); `name`:
    // how the node's /diagnostics names this consumer. `ready_signal` false: stay on
    // protocol version 1 (descriptors from your TensorRef subscription, acquire()).
    explicit Consumer(const std::string &socket_path, const std::string &name = "vision_preproc_consumer_cpp",
                      bool ready_signal = true) {
        char err[512] = {0};
        vp_consumer *c = nullptr;
        if (vp_connect(socket_path.c_str(), ready_signal ? name.c_str() : nullptr, &c, err, sizeof err) != VP_OK)
            throw Error(err);
        c_.reset(c);
    }
    // The newest pool socket of this user's nodes.
    static std::string find_socket() {
        char path[512];
        if (vp_find_socket(path, sizeof path) != VP_OK) throw Error(vp_last_error());
        return path;
    }
    int protocol() const { return vp_protocol(c_.get()); }
    std::string memory() const { return vp_memory(c_.get()); }
    std::string pool_id() const { return vp_pool_id(c_.get()); }
    uint64_t dropped() const { return vp_dropped(c_.get()); }

    // The next tensor the node announces, acquired and ready (a reused or withdrawn one is
    // skipped); nullopt after `timeout` without one. Throws when the connection ended
    // (a new pool: connect again) or the node speaks version 1 only.
    std::optional<Frame> next(std::chrono::milliseconds timeout) {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                              std::chrono::steady_clock::now());
            Tensor t;
            int rc = vp_wait(c_.get(), static_cast<int>(std::max<long long>(0, left.count())), &t);
            if (rc == VP_TIMEOUT) return std::nullopt;
            if (rc == VP_CLOSED) throw Error("the node closed the connection (a new pool, or it exited)");
            if (rc != VP_OK) throw Error(vp_last_error());
            if (auto f = acquire(t)) return f;
        }
    }
    // Acquire a descriptor (from next()'s wait, or Tensor::from_msg on version 1):
    // nullopt when it was reused or withdrawn.
    std::optional<Frame> acquire(const Tensor &t) {
        Tensor held = t;
        int rc = vp_acquire(c_.get(), &held);
        if (rc == VP_SKIPPED || rc == VP_WITHDRAWN) return std::nullopt;
        if (rc != VP_OK) throw Error(vp_last_error());
        return Frame(c_.get(), held);
    }
    vp_consumer *get() const { return c_.get(); }

  private:
    struct Close {
        void operator()(vp_consumer *c) const { vp_close(c); }
    };
    std::unique_ptr<vp_consumer, Close> c_;
};

}  // namespace vp

#endif
