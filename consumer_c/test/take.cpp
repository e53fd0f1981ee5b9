// The version 1 path of the C++ consumer, for test/ros/test_consumer_c.py: connected to the
// pool socket `argv[1]` without the ready signal, it takes the descriptors the test's rclpy
// subscription received on the TensorRef topic, one per line on stdin ("<stamp_ns>
// <block_index> <generation> <memory_kind> <byte_offset> <byte_size>"), with
// vp::Consumer::acquire, and prints "<stamp_ns> <FNV-1a 64 of the bytes>" or
// "<stamp_ns> skipped" (the block was reused first).
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "vision_preproc/consumer.hpp"

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: consumer_c_take SOCKET < descriptors\n");
        return 2;
    }
    try {
        vp::Consumer consumer(argv[1], "", false);
        std::printf("protocol version %d\n", consumer.protocol());
        std::fflush(stdout);
        std::string line;
        while (std::getline(std::cin, line)) {
            std::istringstream in(line);
            long long stamp;
            unsigned block, kind;
            unsigned long long generation, offset, size;
            if (!(in >> stamp >> block >> generation >> kind >> offset >> size)) return 3;
            vp::Tensor t;
            vp_tensor_from_fields(&t, block, generation, static_cast<uint8_t>(kind), offset, size, nullptr, 0);
            auto frame = consumer.acquire(t);
            if (!frame) {
                std::printf("%lld skipped\n", stamp);
            } else {
                const auto *p = frame->host<uint8_t>();
                unsigned long long h = 0xcbf29ce484222325ull;
                for (unsigned long long i = 0; i < size; i++) h = (h ^ p[i]) * 0x100000001b3ull;
                std::printf("%lld %016llx\n", stamp, h);
            }
            std::fflush(stdout);
        }
    } catch (const vp::Error &e) {
        std::fprintf(stderr, "consumer_c_take: %s\n", e.what());
        return 1;
    }
    return 0;
}
