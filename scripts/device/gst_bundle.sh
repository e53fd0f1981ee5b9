#!/usr/bin/env bash
# Bundle Debian 12's GStreamer 1.22 run-time for the node's `gst:` inputs on a machine
# without GStreamer or glib (the GPU machine: libc, libstdc++, zlib, no network). The
# node links libgstreamer, libgstapp, libgstvideo, glib and gobject; the ROS bundle
# (ros_bundle.sh) carries only the libraries of .ros/, so without this one the node does
# not start there.
#
# The packages are fetched with `apt-get download` (the versions of this machine's apt
# lists) and unpacked with `dpkg -x`; only what runs is kept, flat, under each file's
# SONAME: the plugins of PLUGINS (the elements our pipelines use: capsfilter, queue,
# filesrc, videotestsrc, appsink, videoconvert, videoscale, videorate, multifilesrc,
# pngdec, rgb2bayer), gst-launch-1.0, gst-inspect-1.0, gst-plugin-scanner, and the libraries they
# and the node NEED, found by following NEEDED entries inside the unpacked packages.
# Every carried file is then checked with ldd against the bundle: a library resolved
# outside it must be one of BASE (libc and the rest of the GPU machine's base system).
# env.sh, at the top, sets the variables that make GStreamer use the bundle alone.
#
#   scripts/device/gst_bundle.sh [DIR]   # default .device/gst (git-excluded); also writes DIR.tar.xz
#   GST_BUNDLE_NVCODEC=1 ...   # + the nvcodec and videoparsersbad plugins (nvh264dec, nvh265dec,
#                              # cudaupload/cudadownload, h264parse, h265parse), GStreamer's CUDA
#                              # and GL libraries and what they load (../shared/notes/video.md);
#                              # nvcodec loads the driver's libcuda/libnvcuvid from the machine
#   GST_BUNDLE_BINS="a b" ...  # the binaries whose libraries are followed (default: the node,
#                              # target/release/vision_preproc_node)
#   # there:  tar xJf .device/gst.tar.xz -C "$G" && source "$G/env.sh" && gst-launch-1.0 ...
#   # (scripts/device/gpu_node_stage.sh calls this script; gpu_node_remote.py unpacks
#   # .device/gst.tar.xz and gives every node the variables of env.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DIR="${1:-$ROOT/.device/gst}"
# glib's own dependencies (libffi, pcre2) and pngdec's libpng are carried too: a base
# system without glib need not have them.
PACKAGES="libgstreamer1.0-0 gstreamer1.0-tools gstreamer1.0-plugins-base
    libgstreamer-plugins-base1.0-0 liborc-0.4-0 gstreamer1.0-plugins-good libglib2.0-0
    libunwind8 libdw1 libelf1 libpng16-16 libffi8 libpcre2-8-0 gstreamer1.0-plugins-bad"
PLUGINS="coreelements videotestsrc app videoconvertscale videorate png multifile bayer"
if [[ "${GST_BUNDLE_NVCODEC:-0}" == 1 ]]; then
    PACKAGES="$PACKAGES libgstreamer-plugins-bad1.0-0 libgstreamer-gl1.0-0 libgudev-1.0-0
        libgraphene-1.0-0 libwayland-client0 libwayland-egl1 libwayland-cursor0
        libwayland-server0 libx11-xcb1 libegl1 libgles2 libgl1 libglvnd0 libglx0 libegl-mesa0
        libgbm1 libdrm2 libxcb1 libxau6 libxdmcp6 libx11-6 libbsd0 libmd0 libxext6 libopengl0
        libglx-mesa0 libexpat1 libudev1"
    PLUGINS="$PLUGINS nvcodec videoparsersbad"
fi
# Resolved from the machine, not carried: the C run-time, and libraries of every
# Debian/Ubuntu base system (dpkg's and util-linux's) that only libdw (compressed debug
# sections: lzma, bz2) and libgio (multifilesrc: mount, blkid, selinux) load; the GPU
# machine (Ubuntu 24.04) has them all.
BASE='libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libz|liblzma|libbz2|libmount|libblkid|libselinux'
grep -q '^VERSION_CODENAME=bookworm$' /etc/os-release \
    || { echo "gst_bundle: Debian 12's packages are wanted; this is not Debian 12"; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/debs" "$TMP/root"
# As root apt would download as user _apt, who cannot write into the private $TMP (a warning).
# shellcheck disable=SC2086
(cd "$TMP/debs" && apt-get download -q -o APT::Sandbox::User=root $PACKAGES)
for deb in "$TMP"/debs/*.deb; do
    dpkg -x "$deb" "$TMP/root"
    dpkg-deb -W --showformat='${Package} ${Version}\n' "$deb" >>"$TMP/versions"
done
LIB="$TMP/root/usr/lib/x86_64-linux-gnu"
# A few packages (libexpat1) still ship their library under /lib: one directory for all.
if [ -d "$TMP/root/lib/x86_64-linux-gnu" ]; then
    mkdir -p "$LIB" && cp -an "$TMP/root/lib/x86_64-linux-gnu/." "$LIB/"
fi

rm -rf "$DIR" "$DIR.tar.xz" && mkdir -p "$DIR/bin" "$DIR/libexec" "$DIR/lib/gstreamer-1.0"
cp "$TMP/root/usr/bin/gst-launch-1.0" "$TMP/root/usr/bin/gst-inspect-1.0" "$DIR/bin/"
cp "$LIB/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner" "$DIR/libexec/"
for p in $PLUGINS; do cp "$LIB/gstreamer-1.0/libgst$p.so" "$DIR/lib/gstreamer-1.0/"; done
# The libraries: the NEEDED closure of the above and of the node, within the packages.
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
# shellcheck disable=SC2206
BINS=(${GST_BUNDLE_BINS:-target/release/vision_preproc_node})
todo=("$DIR"/bin/* "$DIR"/libexec/* "$DIR"/lib/gstreamer-1.0/* "${BINS[@]}")
while [ ${#todo[@]} -gt 0 ]; do
    f="${todo[0]}"; todo=("${todo[@]:1}")
    for so in $(needed "$f"); do
        if [ -e "$LIB/$so" ] && [ ! -e "$DIR/lib/$so" ]; then
            cp -L "$LIB/$so" "$DIR/lib/$so"
            todo+=("$DIR/lib/$so")
        fi
    done
done
sort "$TMP/versions" >"$DIR/VERSIONS"
cat >"$DIR/env.sh" <<'EOF'
# Source it (bash) to run this GStreamer and nothing of the machine's: its libraries
# first, its plugins alone, its plugin scanner, a registry of its own. The *_1_0 variants
# win over the plain names in GStreamer, so they go too. gpu_node_remote.py
# (python/vptools/node_scenarios/) sets the same variables for the nodes it starts.
GST_BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="$GST_BUNDLE/bin${PATH:+:$PATH}"
export LD_LIBRARY_PATH="$GST_BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GST_PLUGIN_SYSTEM_PATH="$GST_BUNDLE/lib/gstreamer-1.0"
export GST_PLUGIN_SCANNER="$GST_BUNDLE/libexec/gst-plugin-scanner"
export GST_REGISTRY=/tmp/vp_gst_registry.bin
unset GST_PLUGIN_PATH GST_PLUGIN_PATH_1_0 GST_PLUGIN_SYSTEM_PATH_1_0 GST_PLUGIN_SCANNER_1_0 GST_REGISTRY_1_0
EOF

# Every carried file resolves within the bundle or to BASE.
for f in "$DIR"/bin/* "$DIR"/libexec/* "$DIR"/lib/*.so* "$DIR"/lib/gstreamer-1.0/*; do
    LD_LIBRARY_PATH="$DIR/lib" ldd "$f" | awk -v d="$DIR/lib/" -v f="${f#"$DIR"/}" '
        /=>/ && $3 == "not" { print f ": " $1 " not found" }
        /=>/ && $3 != "not" && index($3, d) != 1 { print f ": " $1 " => " $3 }'
done | sort -u >"$TMP/outside"
if grep -vE "^[^ ]+: ($BASE)\.so[^ ]* => " "$TMP/outside"; then
    echo "gst_bundle: the libraries above resolve outside $DIR and are not in BASE"; exit 1
fi
echo "from the machine: $(awk '{print $2}' "$TMP/outside" | sort -u | paste -sd' ')"
tar cJf "$DIR.tar.xz" -C "$DIR" .
echo "bundle: $(find "$DIR/lib" -maxdepth 1 -name '*.so*' | wc -l) libraries, $(find "$DIR/lib/gstreamer-1.0" -name '*.so' | wc -l) plugins," \
    "$(du -sh "$DIR" | cut -f1) in $DIR, $(du -sh "$DIR.tar.xz" | cut -f1) as $DIR.tar.xz"
