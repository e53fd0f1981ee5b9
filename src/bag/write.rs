//! Writing a rosbag2 bag without ROS: a folder with one MCAP file (profile `ros2`, CDR
//! messages, `ros2msg` schemas) and the `metadata.yaml` rosbag2 and the `rosbags`
//! library read. Deterministic: nothing depends on the wall clock, so the same messages
//! give the same bytes.

use crate::error::{Error, Result};
use crate::wire::msgs::schema;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

struct Topic {
    name: String,
    type_name: String,
    channel: u16,
    count: u64,
}

/// A rosbag2 MCAP bag being written.
pub struct BagWriter {
    dir: PathBuf,
    file_name: String,
    mcap: mcap::Writer<BufWriter<File>>,
    topics: Vec<Topic>,
    first: Option<u64>,
    last: u64,
    count: u64,
}

fn bag_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Bag { path: path.display().to_string(), message: message.into() }
}

impl BagWriter {
    /// Create the bag folder `dir` (it must not exist, like `ros2 bag record -o`).
    pub fn create(dir: &Path) -> Result<BagWriter> {
        if dir.exists() {
            return Err(bag_err(dir, "already exists; choose another output or remove it"));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let stem = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "bag".into());
        let file_name = format!("{stem}_0.mcap");
        let path = dir.join(&file_name);
        let file = File::create(&path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        let mcap = mcap::WriteOptions::new()
            .profile("ros2")
            .compression(None)
            .create(BufWriter::new(file))
            .map_err(|e| bag_err(&path, format!("starting MCAP: {e}")))?;
        Ok(BagWriter {
            dir: dir.to_path_buf(),
            file_name,
            mcap,
            topics: Vec::new(),
            first: None,
            last: 0,
            count: 0,
        })
    }

    /// Declare a topic of one of the types this crate writes (`vision_preproc_msgs/msg/
    /// Tensor`, `.../FrameTiming`); returns its index for [`BagWriter::write`].
    pub fn add_topic(&mut self, name: &str, type_name: &str) -> Result<usize> {
        let text = schema(type_name)
            .ok_or_else(|| bag_err(&self.dir, format!("no schema for {type_name}")))?;
        let schema_id = self
            .mcap
            .add_schema(type_name, "ros2msg", text.as_bytes())
            .map_err(|e| bag_err(&self.dir, format!("adding schema {type_name}: {e}")))?;
        let mut meta = BTreeMap::new();
        meta.insert("offered_qos_profiles".to_string(), String::new());
        let channel = self
            .mcap
            .add_channel(schema_id, name, "cdr", &meta)
            .map_err(|e| bag_err(&self.dir, format!("adding channel {name}: {e}")))?;
        self.topics.push(Topic {
            name: name.into(),
            type_name: type_name.into(),
            channel,
            count: 0,
        });
        Ok(self.topics.len() - 1)
    }

    /// Write one CDR message on topic `topic` (from [`BagWriter::add_topic`]) at
    /// `log_time` (ns since the epoch).
    pub fn write(&mut self, topic: usize, log_time: u64, cdr: &[u8]) -> Result<()> {
        let t = self
            .topics
            .get_mut(topic)
            .ok_or_else(|| bag_err(&self.dir, format!("no topic #{topic}")))?;
        let header = mcap::records::MessageHeader {
            channel_id: t.channel,
            sequence: t.count as u32,
            log_time,
            publish_time: log_time,
        };
        self.mcap
            .write_to_known_channel(&header, cdr)
            .map_err(|e| bag_err(&self.dir, format!("writing to {}: {e}", t.name)))?;
        t.count += 1;
        self.count += 1;
        self.first = Some(self.first.map_or(log_time, |f| f.min(log_time)));
        self.last = self.last.max(log_time);
        Ok(())
    }

    /// Finish the MCAP file and write `metadata.yaml` (`ros_distro` as rosbag2 writes it:
    /// the environment's `ROS_DISTRO`, empty when unset).
    pub fn finish(mut self) -> Result<PathBuf> {
        self.mcap.finish().map_err(|e| bag_err(&self.dir, format!("finishing MCAP: {e}")))?;
        let start = self.first.unwrap_or(0);
        let duration = self.last.saturating_sub(start);
        let mut yaml = format!(
            "rosbag2_bagfile_information:\n  version: 9\n  storage_identifier: mcap\n  \
             duration:\n    nanoseconds: {duration}\n  starting_time:\n    nanoseconds_since_epoch: {start}\n  \
             message_count: {count}\n  topics_with_message_count:\n",
            count = self.count
        );
        for t in &self.topics {
            yaml += &format!(
                "    - topic_metadata:\n        name: {}\n        type: {}\n        serialization_format: cdr\n        \
                 offered_qos_profiles: []\n        type_description_hash: ''\n      message_count: {}\n",
                t.name, t.type_name, t.count
            );
        }
        yaml += &format!(
            "  compression_format: ''\n  compression_mode: ''\n  relative_file_paths:\n    - {f}\n  files:\n    \
             - path: {f}\n      starting_time:\n        nanoseconds_since_epoch: {start}\n      duration:\n        \
             nanoseconds: {duration}\n      message_count: {count}\n  custom_data: ~\n  ros_distro: '{distro}'\n",
            f = self.file_name,
            count = self.count,
            distro = ros_distro()
        );
        let meta = self.dir.join("metadata.yaml");
        std::fs::write(&meta, yaml)
            .map_err(|e| Error::io(format!("writing {}", meta.display()), e))?;
        Ok(self.dir)
    }
}

/// The distribution this process runs in, as rosbag2 records it: `ROS_DISTRO` (set by every
/// ROS set-up file; `scripts/setup/setup.sh`'s `.ros/env.sh` sets the installed one), or empty.
fn ros_distro() -> String {
    std::env::var("ROS_DISTRO")
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect()
}
