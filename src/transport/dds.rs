//! The node's own Fast DDS transports: a shared-memory segment sized from the largest
//! sample the node publishes, instead of a fixed large one (Fast DDS writes its whole
//! segment when it creates it, so the segment is resident memory from the start), and a
//! UDP transport with socket buffers as large as the kernel allows (what a reader can do
//! for large samples that do not come through shared memory).
//!
//! Used only when the user gave no profile (neither `FASTRTPS_DEFAULT_PROFILES_FILE`, what
//! Fast DDS 2 reads, nor `FASTDDS_DEFAULT_PROFILES_FILE`, Fast DDS 3's; `ros::dds`).
//! Camera drivers need the shipped `config/fastdds_large_frames.xml`: a best-effort
//! frame travels through shared memory only when it fits the **publisher's** segment.

use crate::config::Config;

/// Samples of the largest output the segment holds at once (a reliable writer keeps a
/// sample until every reader has it; a few in flight keep the writer from waiting).
pub(crate) const SEGMENT_SAMPLES: usize = 4;
/// Smallest segment (camera_info, timing and diagnostics need little; 16 MB also holds
/// one 1080p bgr8 frame for a node that receives through shared memory).
pub(crate) const MIN_SEGMENT: usize = 16 << 20;
/// Bytes a `Tensor` or `Image` message carries besides its data (header, names,
/// shape, geometry), rounded up generously.
const MESSAGE_OVERHEAD: usize = 4096;
/// Socket buffers asked for the UDP transport; the kernel caps them at
/// `net.core.rmem_max` / `wmem_max`.
pub(crate) const UDP_BUFFER: usize = 8 << 20;

/// Bytes of the largest sample a node with `cfg` publishes: the tensor (with 2+
/// `inputs`, the `TensorBatch` of that many tensors and their items), or the
/// `debug_image` (rgb8 or mono8 of the network size) when that is larger.
pub(crate) fn largest_output(cfg: &Config) -> usize {
    let pixels = cfg.network_image_width as usize * cfg.network_image_height as usize;
    let items = cfg.inputs.len().max(1);
    let debug = pixels * if cfg.output_channels == 1 { 1 } else { 3 };
    cfg.tensor_bytes().max(debug) + MESSAGE_OVERHEAD * items
}

/// The segment for samples of at most `largest` bytes: [`SEGMENT_SAMPLES`] of them, at
/// least [`MIN_SEGMENT`], in whole MiB.
pub(crate) fn segment_size(largest: usize) -> usize {
    (largest.saturating_mul(SEGMENT_SAMPLES)).max(MIN_SEGMENT).next_multiple_of(1 << 20)
}

/// A Fast DDS XML profile (default participant profile) with a shared-memory transport
/// of `segment` bytes, a UDPv4 transport with `udp_buffer`-byte socket buffers, and
/// participant announcements every 0.5 s as in the shipped camera profile
/// (config/fastdds_large_frames.xml says why: a missed first exchange otherwise costs
/// up to Fast DDS's default 3-s period at start-up).
pub(crate) fn profile_xml(segment: usize, udp_buffer: usize) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8" ?>
<!-- Written by vision_preproc_node for itself (no Fast DDS profile was
     given): shared-memory segment sized from its largest output, {segment} bytes. -->
<dds xmlns="http://www.eprosima.com">
  <profiles>
    <transport_descriptors>
      <transport_descriptor>
        <transport_id>shm_sized</transport_id>
        <type>SHM</type>
        <segment_size>{segment}</segment_size>
      </transport_descriptor>
      <transport_descriptor>
        <transport_id>udp_buffers</transport_id>
        <type>UDPv4</type>
        <sendBufferSize>{udp_buffer}</sendBufferSize>
        <receiveBufferSize>{udp_buffer}</receiveBufferSize>
      </transport_descriptor>
    </transport_descriptors>
    <participant profile_name="vision_preproc_sized" is_default_profile="true">
      <rtps>
        <userTransports>
          <transport_id>shm_sized</transport_id>
          <transport_id>udp_buffers</transport_id>
        </userTransports>
        <useBuiltinTransports>false</useBuiltinTransports>
        <builtin>
          <discovery_config>
            <leaseAnnouncement>
              <sec>0</sec>
              <nanosec>500000000</nanosec>
            </leaseAnnouncement>
          </discovery_config>
        </builtin>
      </rtps>
    </participant>
  </profiles>
</dds>
"#
    )
}

/// The kernel's limit for socket buffers (`/proc/sys/net/core/{rmem,wmem}_max`, the
/// smaller), if readable.
pub(crate) fn socket_buffer_limit() -> Option<usize> {
    let read = |p: &str| std::fs::read_to_string(p).ok()?.trim().parse::<usize>().ok();
    Some(read("/proc/sys/net/core/rmem_max")?.min(read("/proc/sys/net/core/wmem_max")?))
}

/// The kernel settings that ROS 2's DDS tuning guide raises for large samples over UDP
/// (`docs.ros.org/en/jazzy/How-To-Guides/DDS-tuning.html`): socket receive buffers,
/// and the memory and time the kernel gives IP fragments to reassemble. They matter
/// when frames cross a network (datagrams of 64 KB are cut into MTU-sized IP
/// fragments); on one machine (loopback, 64 KB MTU) they changed nothing measurable
/// (docs/QOS_AND_TRANSPORTS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelUdp {
    /// `net.core.rmem_max`, bytes: the largest socket receive buffer a process may ask.
    pub rmem_max: u64,
    /// `net.ipv4.ipfrag_high_thresh`, bytes: memory for fragments being reassembled.
    pub ipfrag_high_thresh: u64,
    /// `net.ipv4.ipfrag_time`, s: how long an incomplete datagram holds that memory.
    pub ipfrag_time: u64,
}

impl KernelUdp {
    /// The tuning guide's values.
    pub(crate) const GUIDE: KernelUdp =
        KernelUdp { rmem_max: 2_147_483_647, ipfrag_high_thresh: 134_217_728, ipfrag_time: 3 };

    /// This machine's settings, if `/proc/sys` can be read.
    pub(crate) fn read() -> Option<KernelUdp> {
        let read = |p: &str| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
        Some(KernelUdp {
            rmem_max: read("/proc/sys/net/core/rmem_max")?,
            ipfrag_high_thresh: read("/proc/sys/net/ipv4/ipfrag_high_thresh")?,
            ipfrag_time: read("/proc/sys/net/ipv4/ipfrag_time")?,
        })
    }

    /// The settings, each with the guide's value where it differs in the guide's
    /// direction (buffers smaller, fragment time longer).
    pub(crate) fn describe(&self) -> String {
        let g = KernelUdp::GUIDE;
        let mark = |below: bool, guide: u64| {
            if below {
                format!(" (guide: {guide})")
            } else {
                String::new()
            }
        };
        format!(
            "net.core.rmem_max={}{}, net.ipv4.ipfrag_high_thresh={}{}, net.ipv4.ipfrag_time={}{}",
            self.rmem_max,
            mark(self.rmem_max < g.rmem_max, g.rmem_max),
            self.ipfrag_high_thresh,
            mark(self.ipfrag_high_thresh < g.ipfrag_high_thresh, g.ipfrag_high_thresh),
            self.ipfrag_time,
            mark(self.ipfrag_time > g.ipfrag_time, g.ipfrag_time),
        )
    }

    /// `sysctl` commands that set what differs from the guide (empty when nothing does).
    pub(crate) fn advice(&self) -> String {
        let g = KernelUdp::GUIDE;
        let mut set = Vec::new();
        if self.rmem_max < g.rmem_max {
            set.push(format!("net.core.rmem_max={}", g.rmem_max));
        }
        if self.ipfrag_high_thresh < g.ipfrag_high_thresh {
            set.push(format!("net.ipv4.ipfrag_high_thresh={}", g.ipfrag_high_thresh));
        }
        if self.ipfrag_time > g.ipfrag_time {
            set.push(format!("net.ipv4.ipfrag_time={}", g.ipfrag_time));
        }
        if set.is_empty() {
            String::new()
        } else {
            format!("sudo sysctl -w {}", set.join(" "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DType;

    /// The node's own profile announces the participant as often as the shipped camera
    /// profile (one fact in two files: the XML users pass to their cameras, and ours).
    #[test]
    fn the_node_s_profile_announces_like_the_shipped_camera_profile() {
        let announcement = |xml: &str| -> String {
            let from = xml.find("<leaseAnnouncement>").expect("a leaseAnnouncement");
            let to = xml.find("</leaseAnnouncement>").expect("its end");
            xml[from..to].split_whitespace().collect()
        };
        let shipped = include_str!("../../config/fastdds_large_frames.xml");
        let ours = profile_xml(16 << 20, 1 << 20);
        assert_eq!(announcement(&ours), announcement(shipped));
        assert!(announcement(&ours).contains("<nanosec>500000000</nanosec>"));
    }

    #[test]
    fn the_segment_follows_the_largest_output() {
        // 640x640x3 float32 = 4,915,200 bytes + 4096 overhead; 4 samples = 19,677,184
        // bytes = 18.8 MiB, rounded up to whole MiB: 19 MiB.
        let cfg =
            Config { network_image_width: 640, network_image_height: 640, ..Default::default() };
        assert_eq!(largest_output(&cfg), 4_915_200 + 4096);
        assert_eq!(segment_size(largest_output(&cfg)), 19 << 20);
        // The default 640x480: 3.7 MB tensors, 4 of them = 14.8 MB -> the 16 MB floor.
        assert_eq!(segment_size(largest_output(&Config::default())), MIN_SEGMENT);
        // 1 channel float16: the mono8 debug image (w*h) is smaller than the tensor
        // (2*w*h).
        let grey = Config { output_channels: 1, output_dtype: DType::Float16, ..cfg.clone() };
        assert_eq!(largest_output(&grey), 640 * 640 * 2 + 4096);
        // Four inputs: one TensorBatch of four tensors (and four items' metadata).
        let four =
            Config { inputs: (0..4).map(|i| format!("cam{i}/image")).collect(), ..cfg.clone() };
        assert_eq!(largest_output(&four), 4 * 4_915_200 + 4 * 4096);
        assert_eq!(segment_size(largest_output(&four)), 76 << 20);
        // 4K float32 output: 99.5 MB tensors -> 380 MiB segment.
        let big = Config { network_image_width: 3840, network_image_height: 2160, ..cfg };
        assert_eq!(
            segment_size(largest_output(&big)),
            (4 * (99_532_800usize + 4096)).next_multiple_of(1 << 20)
        );
    }

    #[test]
    fn kernel_settings_are_compared_with_the_tuning_guide() {
        // Debian's defaults on this VM (rmem_max raised to 4 MB by its image).
        let here =
            KernelUdp { rmem_max: 4_194_304, ipfrag_high_thresh: 4_194_304, ipfrag_time: 30 };
        assert_eq!(
            here.describe(),
            "net.core.rmem_max=4194304 (guide: 2147483647), net.ipv4.ipfrag_high_thresh=4194304 \
             (guide: 134217728), net.ipv4.ipfrag_time=30 (guide: 3)"
        );
        assert_eq!(
            here.advice(),
            "sudo sysctl -w net.core.rmem_max=2147483647 net.ipv4.ipfrag_high_thresh=134217728 \
             net.ipv4.ipfrag_time=3"
        );
        let tuned = KernelUdp { ipfrag_time: 2, ..KernelUdp::GUIDE };
        assert_eq!(tuned.advice(), "");
        assert!(!tuned.describe().contains("guide"), "{}", tuned.describe());
        // This machine's are readable (Linux).
        assert!(KernelUdp::read().is_some_and(|k| k.rmem_max > 0 && k.ipfrag_time > 0));
    }

    #[test]
    fn the_profile_names_both_transports() {
        let xml = profile_xml(20 << 20, 4 << 20);
        assert!(xml.contains("<segment_size>20971520</segment_size>"), "{xml}");
        assert!(xml.contains("<receiveBufferSize>4194304</receiveBufferSize>"), "{xml}");
        assert!(xml.contains("<useBuiltinTransports>false</useBuiltinTransports>"));
        assert!(xml.contains(r#"is_default_profile="true""#));
    }
}
