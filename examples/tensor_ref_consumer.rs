//! A Rust consumer of `tensor_ref` (docs/HANDOFF.md): the tensors the node wrote into its
//! shared blocks, read in place (no copy, no deserialization of the tensor), with r2r.
//! Host blocks (CPU backend) are read as bytes; CUDA blocks (CUDA backend) are imported
//! on the GPU, where a network would read them at the printed device address (printed
//! once per pool); this example copies each tensor to the host for its mean and DUMP.
//! Prints, once a second, the frames read and skipped, the mean of the last tensor and
//! the age of the frames (node clock vs the camera stamp) when they were taken.
//!
//!   vision_preproc_node --ros-args -p backend:=cpu &   # (or cuda) and a camera on `image`
//!   cargo run --release --example tensor_ref_consumer -- /tensor_ref 10 [DUMP]
//!
//! With DUMP, one line per frame read there: its stamp (ns) and the FNV-1a 64 of its
//! tensor bytes (to compare with the same frames' `tensor` messages).
//!
//! On the node's machine it asks the pool for the ready signal (protocol 2,
//! docs/HANDOFF.md) and takes each tensor's descriptor from the pool's socket as soon as
//! the node announces it, reporting back when it had and released each one; it prints
//! which path the pool's tensors take.
use futures::{FutureExt, StreamExt};
use r2r::vision_preproc_msgs::msg::{FrameTiming, TensorRef};
use r2r::WrappedTypesupport;
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vision_preproc::consumer::{Consumer, Held};
use vision_preproc::handoff::MemoryKind;

/// The tensor's bytes: in place for host memory; for CUDA memory copied into `host`
/// (after `Held::ready` and the checks of `Held::device`), its device address printed once
/// per pool (`shown`).
fn tensor_bytes<'a>(
    held: &'a Held<'_>,
    msg: &TensorRef,
    host: &'a mut Vec<u8>,
    shown: &mut bool,
) -> anyhow::Result<&'a [u8]> {
    let (at, len) = (msg.byte_offset as usize, msg.byte_size as usize);
    let Some(block) = held.device(msg.device_id, &msg.device_uuid, &msg.ipc_event_handle)? else {
        return Ok(&held.bytes()[at..at + len]);
    };
    if !std::mem::replace(shown, true) {
        println!(
            "pool {}: CUDA blocks on device {}; block {} at device address {:#x} ({} bytes \
             mapped), the tensor at +{at}",
            msg.pool_id,
            block.device_id(),
            msg.block_index,
            block.ptr(),
            block.len()
        );
    }
    host.resize(len, 0);
    block.copy_to_host(at, host)?;
    Ok(host)
}

/// What the example counts and prints.
struct Reader {
    read: u64,
    skipped: u64,
    ages_ms: Vec<f64>,
    all_ages: Vec<f64>,
    /// CUDA blocks: the tensor's copy on the host; whether the pool's address was printed.
    host: Vec<u8>,
    shown: bool,
    dump: Option<std::fs::File>,
    report: Instant,
}

impl Reader {
    /// One tensor (`msg`, its descriptor received at `received_ns`, from the topic or the
    /// socket): taken, read, given back.
    fn frame(
        &mut self,
        consumer: &Consumer,
        msg: &TensorRef,
        received_ns: i64,
        via_topic: bool,
    ) -> anyhow::Result<()> {
        let Some(held) = consumer.take(msg.block_index, msg.generation) else {
            self.skipped += 1; // reused before we took it
            return Ok(());
        };
        if !held.ready(&msg.ipc_event_handle)? {
            self.skipped += 1; // withdrawn: the node's GPU work on it failed
            return Ok(());
        }
        let stamp_ns =
            i64::from(msg.header.stamp.sec) * 1_000_000_000 + i64::from(msg.header.stamp.nanosec);
        held.usable(stamp_ns, received_ns, via_topic); // (the node's report of this consumer)
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
        let bytes = tensor_bytes(&held, msg, &mut self.host, &mut self.shown)?;
        if let Some(f) = self.dump.as_mut() {
            use std::io::Write;
            let fnv = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
            writeln!(f, "{stamp_ns} {fnv:016x}")?;
        }
        // The network would run here, on the block in place; this one takes a mean.
        let mean = if msg.dtype == "float32" {
            let v: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            v.iter().sum::<f32>() / v.len().max(1) as f32
        } else {
            f32::NAN
        };
        let age = (now - stamp_ns as f64 * 1e-9) * 1e3;
        self.ages_ms.push(age);
        self.all_ages.push(age);
        self.read += 1;
        drop(held); // give the block back as soon as the work on it is done
        if self.report.elapsed() >= Duration::from_secs(1) {
            self.ages_ms.sort_by(f64::total_cmp);
            let p50 = self.ages_ms.get(self.ages_ms.len() / 2).copied().unwrap_or(f64::NAN);
            println!(
                "{} read, {} skipped; last {:?} {} mean {mean:.4}; age p50 {p50:.2} ms",
                self.read, self.skipped, msg.shape, msg.dtype
            );
            self.ages_ms.clear();
            self.report = Instant::now();
        }
        Ok(())
    }
}

/// Connect to the pool of `msg` and ask for the ready signal; says which path its tensors
/// take.
fn connect(msg: &TensorRef) -> anyhow::Result<Consumer> {
    let c = Consumer::connect(std::path::Path::new(&msg.socket_path))?;
    let on_socket = c.upgrade("tensor_ref_consumer")?;
    println!(
        "pool {}: tensors from {}",
        msg.pool_id,
        if on_socket {
            "the pool's socket (ready signal, protocol 2)"
        } else {
            "the topic (the node speaks protocol 1 only)"
        }
    );
    Ok(c)
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let topic = args.next().unwrap_or_else(|| "/tensor_ref".into());
    let seconds: f64 = args.next().map_or(Ok(10.0), |s| s.parse())?;
    let dump = args.next().map(std::fs::File::create).transpose()?;
    let ctx = r2r::Context::create()?;
    let mut node = r2r::Node::create(ctx, "tensor_ref_consumer", "")?;
    let mut refs = node.subscribe::<TensorRef>(&topic, r2r::QosProfile::default())?;
    // The node's FrameTiming next to it: node-added latency of the same frames.
    let timing_topic = format!("{}timing", topic.trim_end_matches("tensor_ref"));
    let mut timings = node.subscribe::<FrameTiming>(&timing_topic, r2r::QosProfile::default())?;
    let mut node_added = Vec::new();
    // One connection per pool (a node run); a new pool_id replaces the old one.
    let mut pools: HashMap<String, Consumer> = HashMap::new();
    let mut r = Reader {
        read: 0,
        skipped: 0,
        ages_ms: Vec::new(),
        all_ages: Vec::new(),
        host: Vec::new(),
        shown: false,
        dump,
        report: Instant::now(),
    };
    // How long one wait for messages may last (ms; VP_SPIN_MS, default 1). On the H200's
    // host a message did not end the wait: with 5 ms the frames were read ~5 ms later
    // (docs/BENCHMARKS.md, *Zero-copy hand-off*). On the socket path the wait is on the
    // socket, which a descriptor ends at once.
    let spin = Duration::from_millis(
        std::env::var("VP_SPIN_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1),
    );
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let on_socket = pools.values().any(|c| c.from_generation().is_some());
        node.spin_once(if on_socket { Duration::ZERO } else { spin });
        while let Some(Some(t)) = timings.next().now_or_never() {
            node_added.push(f64::from(t.total_us) / 1e3);
        }
        while let Some(Some(msg)) = refs.next().now_or_never() {
            let received_ns = now_ns();
            let stale = pools.get(&msg.pool_id).is_some_and(|c| !c.connected());
            if stale || !pools.contains_key(&msg.pool_id) {
                pools.clear();
                let c = connect(&msg)?;
                r.shown = c.memory() == MemoryKind::Host;
                pools.insert(msg.pool_id.clone(), c);
            }
            let Some(consumer) = pools.get(&msg.pool_id) else { continue };
            let from = consumer.from_generation();
            if from.is_some_and(|g| msg.generation >= g) {
                continue; // its descriptor comes on the socket
            }
            r.frame(consumer, &msg, received_ns, from.is_some())?;
        }
        let Some(consumer) = pools.values().find(|c| c.from_generation().is_some()) else {
            continue;
        };
        match consumer.next_descriptor(spin) {
            Ok(Some(d)) => {
                let msg = TensorRef::from_serialized_bytes(&d.cdr)?;
                r.frame(consumer, &msg, d.received_ns, false)?;
            }
            Ok(None) => {}
            Err(_) => pools.clear(), // the node closed it: the next message connects again
        }
    }
    let pct = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN)
    };
    let dropped: u64 = pools.values().map(Consumer::dropped).sum();
    println!(
        "{} read, {} skipped, {dropped} descriptors dropped by the node in {seconds} s; stamp -> \
         readable p50 {:.2} ms, p99 {:.2} ms; node-added p50 {:.2} ms, p99 {:.2} ms",
        r.read,
        r.skipped,
        pct(&mut r.all_ages, 0.5),
        pct(&mut r.all_ages, 0.99),
        pct(&mut node_added, 0.5),
        pct(&mut node_added, 0.99)
    );
    Ok(())
}
