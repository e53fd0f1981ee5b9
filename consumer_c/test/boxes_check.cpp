// The C++ box mapping on the lines of `vision_preproc geometry-cases` (stdin): for each
// "<format> <scale_x> <scale_y> <offset_x> <offset_y> <k> <k inputs> ..." line, prints
// "<k to_source> <k to_network>" computed with vp::to_source / vp::to_network
// (test/python/test_boxes.py compares them with the Rust results on the same line).
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "vision_preproc/boxes.hpp"

int main() {
    std::string line;
    std::cout.precision(17);
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string name;
        vp_geometry g{};
        size_t k = 0;
        in >> name >> g.scale_x >> g.scale_y >> g.offset_x >> g.offset_y >> k;
        std::vector<double> values(k);
        for (auto &v : values) in >> v;
        if (!in) {
            std::fprintf(stderr, "unreadable line: %s\n", line.c_str());
            return 1;
        }
        vp::BoxFormat f = name == "xyxy" ? vp::BoxFormat::xyxy
                          : name == "xywh" ? vp::BoxFormat::xywh
                                           : vp::BoxFormat::points;
        std::vector<double> source = values, network = values;
        vp::to_source(source, g, f);
        vp::to_network(network, g, f);
        for (double v : source) std::cout << v << ' ';
        for (size_t i = 0; i < k; i++) std::cout << network[i] << (i + 1 < k ? ' ' : '\n');
    }
    return 0;
}
