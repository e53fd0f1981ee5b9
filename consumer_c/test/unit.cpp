// Unit tests of the C/C++ consumer without a node: the hello's JSON scanner, the box
// mapping's refusals, and connecting to no socket / a socket that is not a node's. (The
// library against a real node: test/ros/test_consumer_c.py.)
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "internal.h"
#include "vision_preproc/consumer.hpp"

static int failures = 0;
#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            std::fprintf(stderr, "%s:%d: CHECK(%s)\n", __FILE__, __LINE__, #cond); \
            failures++;                                                        \
        }                                                                      \
    } while (0)

struct Fields {
    std::vector<std::string> seen;
};

static void collect(const char *key, char kind, const char *text, size_t len, void *user) {
    static_cast<Fields *>(user)->seen.push_back(std::string(key) + ":" + kind + ":" + std::string(text, len));
}

static void json_scanner() {
    const char *j = "{\"magic\": \"vision_preproc/pool\", \"version\": 1, \"blocks\": 4, \"versions\": [1, 2], "
                    "\"nested\": {\"a\": [1, {\"b\": 2}]}, \"ok\": true, \"s\": \"a\\\"b\"}";
    Fields f;
    CHECK(vp_json_object(j, std::strlen(j), collect, &f) == 0);
    CHECK(f.seen.size() == 7);
    CHECK(f.seen[0] == "magic:s:vision_preproc/pool");
    CHECK(f.seen[1] == "version:n:1");
    CHECK(f.seen[3] == "versions:a:1, 2");
    CHECK(f.seen[5] == "ok:o:true");
    CHECK(f.seen[6] == "s:s:a\\\"b");
    Fields g;
    CHECK(vp_json_object("[1]", 3, collect, &g) == -1);
    CHECK(vp_json_object("{\"a\" 1}", 7, collect, &g) == -1);
}

static void boxes_refusals() {
    std::vector<float> three = {1, 2, 3};
    vp_geometry g{0.5, 0.5, 0, 0};
    bool threw = false;
    try {
        vp::to_source(three, g);
    } catch (const std::invalid_argument &) {
        threw = true;
    }
    CHECK(threw && three[0] == 1.0f);
    vp_geometry stale{0, 0, 0, 0};
    std::vector<double> box = {0, 0, 1, 1};
    CHECK(vp_to_source_d(&stale, VP_XYXY, box.data(), box.size()) == -1);
    // 1920x1080 -> 640x640 letterbox: the content's corners are the image's.
    vp_geometry lb{1.0 / 3.0, 1.0 / 3.0, 0, 140};
    std::vector<double> content = {0, 140, 640, 500};
    vp::to_source(content, lb);
    CHECK(std::abs(content[2] - 1920) < 1e-9 && std::abs(content[3] - 1080) < 1e-9 && std::abs(content[1]) < 1e-9);
}

static void connecting_to_what_is_not_a_node() {
    char err[512] = {0};
    vp_consumer *c = nullptr;
    CHECK(vp_connect("/nonexistent/vision_preproc/x.sock", "t", &c, err, sizeof err) == VP_ERROR);
    CHECK(std::strstr(err, "connecting to /nonexistent") != nullptr);
    // A server that sends a hello of another program.
    std::string path = "/tmp/vp_consumer_c_unit_" + std::to_string(getpid()) + ".sock";
    int srv = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    unlink(path.c_str());
    CHECK(bind(srv, reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0 && listen(srv, 1) == 0);
    std::thread server([srv] {
        int fd = accept(srv, nullptr, nullptr);
        const char *json = "{\"magic\": \"something/else\", \"version\": 1}";
        uint32_t len = static_cast<uint32_t>(std::strlen(json));
        CHECK(write(fd, &len, 4) == 4 && write(fd, json, len) == static_cast<ssize_t>(len));
        close(fd);
    });
    CHECK(vp_connect(path.c_str(), "t", &c, err, sizeof err) == VP_ERROR);
    CHECK(std::strstr(err, "not a vision_preproc pool") != nullptr);
    server.join();
    close(srv);
    unlink(path.c_str());
    bool threw = false;
    try {
        vp::Consumer bad(path);
    } catch (const vp::Error &e) {
        threw = std::strstr(e.what(), "connecting to") != nullptr;
    }
    CHECK(threw);
}

static void cuda_without_a_driver() {
    // A CUDA pool on a machine without the driver library: the error names the fix.
    setenv("VISION_PREPROC_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    vp_cuda *d = nullptr;
    CHECK(vp_cuda_import(nullptr, 0, 4096, 0, &d) == VP_ERROR);
    CHECK(std::strstr(vp_last_error(), "needs the NVIDIA driver's /nonexistent/libcuda.so.1") != nullptr);
    CHECK(std::strstr(vp_last_error(), "backend: cpu") != nullptr);
    vp_cuda_close(d);
    unsetenv("VISION_PREPROC_LIBCUDA");
}

int main() {
    json_scanner();
    cuda_without_a_driver();
    boxes_refusals();
    connecting_to_what_is_not_a_node();
    if (failures) std::fprintf(stderr, "%d checks failed\n", failures);
    else std::printf("consumer_c unit: all checks passed\n");
    return failures ? 1 : 0;
}
