// A C++ consumer of the node's tensors (docs/HANDOFF.md, "C and C++"), without ROS: it
// connects to the node's pool socket, waits for each tensor on the socket (protocol
// version 2), and feeds it to a computation in place: on host memory (CPU backend) the
// sum of |x| over the tensor read where the node wrote it; on CUDA memory (CUDA backend)
// cuBLAS's cublasSasum on the block's device address (libcublas loaded at run time), the
// tensor never copied. Prints once a second the frames read and the camera stamp ->
// usable latency, the first frame's geometry and the network image mapped back to source
// pixels (vp::to_source).
//
//   consumer_c/build/tensor_ref_consumer_cpp [SOCKET|auto] [SECONDS] [DUMP]
//
// With DUMP, one line per frame: its stamp (ns), the FNV-1a 64 of its bytes (CUDA: copied
// to the host for this check only), the sum of |x|, and its latency (ns).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "vision_preproc/consumer.hpp"

namespace {

// cuBLAS and the driver's copy, loaded at run time (only for CUDA memory).
struct Cuda {
    void *blas = nullptr;
    void *handle = nullptr;
    int (*create)(void **) = nullptr;
    int (*sasum)(void *, int, const float *, int, float *) = nullptr;
    int (*copy)(void *, unsigned long long, size_t) = nullptr;

    bool load() {
        for (const char *name : {"libcublas.so", "libcublas.so.13", "libcublas.so.12"})
            if ((blas = dlopen(name, RTLD_NOW))) break;
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (cuda) *(void **)&copy = dlsym(cuda, "cuMemcpyDtoH_v2");
        if (!blas) return false;
        *(void **)&create = dlsym(blas, "cublasCreate_v2");
        *(void **)&sasum = dlsym(blas, "cublasSasum_v2");
        return create && sasum && create(&handle) == 0;
    }
};

uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// The computation on the tensor in place: sum of |x| (float32 tensors).
double sum_abs(const vp::Frame &f, Cuda &cuda, std::vector<uint8_t> &host, bool dump) {
    const vp::Tensor &t = f.tensor();
    const size_t n = t.byte_size / 4;
    if (const float *x = f.host<float>()) {
        double s = 0;
        for (size_t i = 0; i < n; i++) s += std::fabs(static_cast<double>(x[i]));
        if (dump) host.assign(reinterpret_cast<const uint8_t *>(x), reinterpret_cast<const uint8_t *>(x) + t.byte_size);
        return s;
    }
    float s = NAN;
    if (cuda.sasum) cuda.sasum(cuda.handle, static_cast<int>(n), reinterpret_cast<const float *>(f.device_ptr()), 1, &s);
    if (dump) {
        host.resize(t.byte_size);
        if (!cuda.copy || cuda.copy(host.data(), f.device_ptr(), t.byte_size) != 0) host.clear();
    }
    return s;
}

void print_geometry(const vp::Frame &f) {
    const vp::Tensor &t = f.tensor();
    if (t.nitems == 0 || t.ndim < 4) return;
    const vp_item &it = t.items[0];
    const bool nchw = std::string(t.layout) == "NCHW";
    const double w = t.shape[nchw ? 3 : 2], h = t.shape[nchw ? 2 : 1];
    std::vector<double> box = {0, 0, w, h};
    vp::to_source(box, f.item(0));
    std::printf("geometry %ux%u -> %gx%g: scale (%.9g, %.9g) offset (%.9g, %.9g); network image -> source "
                "[%.6f %.6f %.6f %.6f]\n", it.source_width, it.source_height, w, h, it.geometry.scale_x,
                it.geometry.scale_y, it.geometry.offset_x, it.geometry.offset_y, box[0], box[1], box[2], box[3]);
}

std::unique_ptr<vp::Consumer> connect(const std::string &where, double until_s) {
    auto start = std::chrono::steady_clock::now();
    for (;;) {
        try {
            auto c = std::make_unique<vp::Consumer>(where == "auto" ? vp::Consumer::find_socket() : where,
                                                    "tensor_ref_consumer_cpp");
            std::printf("pool %s: %s memory, protocol version %d\n", c->pool_id().c_str(), c->memory().c_str(),
                        c->protocol());
            std::fflush(stdout);
            return c;
        } catch (const vp::Error &e) {
            if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > until_s) throw;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
}

}  // namespace

int main(int argc, char **argv) {
    const std::string where = argc > 1 ? argv[1] : "auto";
    const double seconds = argc > 2 ? std::stod(argv[2]) : 10.0;
    FILE *dump = argc > 3 ? std::fopen(argv[3], "w") : nullptr;
    Cuda cuda;
    std::vector<uint8_t> host;
    std::vector<double> ages_ms;
    long read = 0;
    bool shown = false;
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    try {
        auto consumer = connect(where, seconds);
        if (consumer->protocol() < 2) {
            std::fprintf(stderr, "the node speaks protocol version 1 only: its descriptors come on the TensorRef "
                                 "topic (vp::Tensor::from_msg with your own subscription)\n");
            return 2;
        }
        if (consumer->memory() == "cuda" && !cuda.load())
            std::fprintf(stderr, "no libcublas: the CUDA tensors are not summed (NaN)\n");
        while (elapsed() < seconds) {
            std::optional<vp::Frame> frame;
            try {
                frame = consumer->next(std::chrono::milliseconds(200));
            } catch (const vp::Error &e) {  // a new pool (the node made one) or the node exited
                std::printf("%s: connecting again\n", e.what());
                consumer = connect(where, seconds - elapsed());
                continue;
            }
            if (!frame) continue;
            double s = sum_abs(*frame, cuda, host, dump != nullptr);
            const vp::Tensor &t = frame->tensor();
            int64_t age = t.acquired_ns - t.stamp_ns;
            if (!shown) print_geometry(*frame), shown = true;
            if (dump)
                std::fprintf(dump, "%lld %016llx %.17g %lld\n", static_cast<long long>(t.stamp_ns),
                             static_cast<unsigned long long>(host.empty() ? 0 : fnv1a(host.data(), host.size())), s,
                             static_cast<long long>(age));
            frame->release();  // after the work on it (CUDA: the context is synchronized first)
            ages_ms.push_back(age / 1e6);
            read++;
        }
        std::sort(ages_ms.begin(), ages_ms.end());
        auto pct = [&](double q) { return ages_ms.empty() ? NAN : ages_ms[static_cast<size_t>((ages_ms.size() - 1) * q)]; };
        std::printf("%ld read in %.1f s, %llu dropped by the node; camera stamp -> usable p50 %.3f ms, p99 %.3f ms\n",
                    read, seconds, static_cast<unsigned long long>(consumer->dropped()), pct(0.5), pct(0.99));
    } catch (const vp::Error &e) {
        std::fprintf(stderr, "tensor_ref_consumer_cpp: %s\n", e.what());
        return 1;
    }
    if (dump) std::fclose(dump);
    return 0;
}
