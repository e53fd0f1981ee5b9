// Detections back to source pixels in C++ (header only): vp::to_source / vp::to_network
// over any contiguous float or double container (std::vector, std::array, a span-like
// {data(), size()}), with a vp_geometry, a vp::Tensor's item, or anything with the four
// fields scale_x, scale_y, offset_x, offset_y (a TensorRef's BatchItem from rclcpp, a
// Tensor message). The arithmetic and the convention: boxes.h (docs/HANDOFF.md, "Boxes
// back to source pixels").
#ifndef VISION_PREPROC_BOXES_HPP
#define VISION_PREPROC_BOXES_HPP

#include <stdexcept>
#include <string>
#include <type_traits>

#include "vision_preproc/boxes.h"

namespace vp {

enum class BoxFormat { xyxy = VP_XYXY, xywh = VP_XYWH, points = VP_POINTS };

// The geometry of anything with the message's four fields.
template <typename Item>
vp_geometry geometry_of(const Item &item) {
    return vp_geometry{static_cast<double>(item.scale_x), static_cast<double>(item.scale_y),
                       static_cast<double>(item.offset_x), static_cast<double>(item.offset_y)};
}
inline vp_geometry geometry_of(const vp_geometry &g) { return g; }

namespace detail {
template <typename Values, typename Item>
void map_boxes(Values &values, const Item &item, BoxFormat format, bool to_source) {
    using T = std::remove_cv_t<std::remove_reference_t<decltype(*values.data())>>;
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "float or double coordinates");
    const vp_geometry g = geometry_of(item);
    const auto f = static_cast<vp_box_format>(format);
    int rc;
    if constexpr (std::is_same_v<T, float>) {
        rc = to_source ? vp_to_source(&g, f, values.data(), values.size())
                       : vp_to_network(&g, f, values.data(), values.size());
    } else {
        rc = to_source ? vp_to_source_d(&g, f, values.data(), values.size())
                       : vp_to_network_d(&g, f, values.data(), values.size());
    }
    if (rc != 0) {
        throw std::invalid_argument(
            std::string(to_source ? "vp::to_source" : "vp::to_network") + ": " + std::to_string(values.size()) +
            " numbers are not whole detections of the format, or the geometry is not usable (a BatchItem with "
            "valid false has no geometry: ignore its slot's detections)");
    }
}
}  // namespace detail

// Network-pixel detections (a flat run: x0 y0 x1 y1 x0 ...) to source pixels, in place.
// Throws std::invalid_argument (nothing changed) for partial detections or a stale item.
template <typename Values, typename Item>
void to_source(Values &values, const Item &item, BoxFormat format = BoxFormat::xyxy) {
    detail::map_boxes(values, item, format, true);
}

// Source-pixel detections to network pixels, in place (the inverse of to_source).
template <typename Values, typename Item>
void to_network(Values &values, const Item &item, BoxFormat format = BoxFormat::xyxy) {
    detail::map_boxes(values, item, format, false);
}

}  // namespace vp

#endif
