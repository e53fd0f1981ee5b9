//! Reading rosbag2 bags without ROS: a bag folder with `metadata.yaml` (MCAP or sqlite3
//! storage), a bare `.mcap` file, or a bare sqlite3 `.db3` file.
//!
//! A damaged bag is read as far as it goes: a truncated MCAP file yields the messages
//! before the damage and then one error saying where it stopped.

use crate::config::Transport;
use crate::error::{Error, Result};
use crate::wire::msgs::{
    COMPRESSED_IMAGE_TYPE, FFMPEG_PACKET_TYPE, FOXGLOVE_VIDEO_TYPE, IMAGE_TYPE,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A topic in a bag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// Topic name, e.g. `/camera/image_raw`.
    pub name: String,
    /// Type, e.g. `sensor_msgs/msg/Image`.
    pub type_name: String,
}

impl TopicInfo {
    /// A `sensor_msgs/msg/CompressedImage` topic.
    pub fn is_compressed_image(&self) -> bool {
        self.type_name == COMPRESSED_IMAGE_TYPE
    }

    /// An image topic of any transport: `sensor_msgs/msg/Image`, `CompressedImage`, or a
    /// video topic (`foxglove_msgs/msg/CompressedVideo`,
    /// `ffmpeg_image_transport_msgs/msg/FFMPEGPacket`).
    pub fn is_image(&self) -> bool {
        self.transport().is_some()
    }

    /// The image_transport transport its type is: `raw`, `compressed`, `foxglove`,
    /// `ffmpeg`; `None` for any other type.
    pub fn transport(&self) -> Option<Transport> {
        match self.type_name.as_str() {
            IMAGE_TYPE => Some(Transport::Raw),
            COMPRESSED_IMAGE_TYPE => Some(Transport::Compressed),
            FOXGLOVE_VIDEO_TYPE => Some(Transport::Foxglove),
            FFMPEG_PACKET_TYPE => Some(Transport::Ffmpeg),
            _ => None,
        }
    }
}

/// One serialized message.
#[derive(Debug, Clone)]
pub struct RawMessage {
    /// Topic name.
    pub topic: String,
    /// Receive time in nanoseconds since the epoch (rosbag2's timestamp / MCAP log time).
    pub log_time: u64,
    /// CDR bytes, with the encapsulation header.
    pub data: Vec<u8>,
}

enum Storage {
    Mcap(Vec<u8>),
    Sqlite(rusqlite::Connection),
}

/// An open bag: its files, in order.
pub struct Bag {
    path: PathBuf,
    files: Vec<(PathBuf, Storage)>,
}

fn bag_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Bag { path: path.display().to_string(), message: message.into() }
}

impl Bag {
    /// Open a bag folder (with `metadata.yaml`), a `.mcap` file or a `.db3` file.
    pub fn open(path: &Path) -> Result<Bag> {
        let files: Vec<PathBuf> = if path.is_dir() {
            let meta = path.join("metadata.yaml");
            if meta.is_file() {
                let text = std::fs::read_to_string(&meta)
                    .map_err(|e| Error::io(format!("reading {}", meta.display()), e))?;
                let doc: serde_yaml::Value = serde_yaml::from_str(&text)
                    .map_err(|e| bag_err(&meta, format!("metadata.yaml does not parse: {e}")))?;
                let rel = doc["rosbag2_bagfile_information"]["relative_file_paths"]
                    .as_sequence()
                    .ok_or_else(|| {
                    bag_err(
                        &meta,
                        "metadata.yaml has no rosbag2_bagfile_information.relative_file_paths",
                    )
                })?;
                rel.iter().filter_map(|v| v.as_str()).map(|f| path.join(f)).collect()
            } else {
                let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                    .map_err(|e| Error::io(format!("listing {}", path.display()), e))?
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "mcap" || x == "db3"))
                    .collect();
                found.sort();
                found
            }
        } else {
            vec![path.to_path_buf()]
        };
        if files.is_empty() {
            return Err(bag_err(
                path,
                "no .mcap or .db3 file (and no metadata.yaml) in this folder",
            ));
        }
        let mut opened = Vec::new();
        for f in files {
            let storage = if f.extension().is_some_and(|x| x == "db3") {
                let conn = rusqlite::Connection::open_with_flags(
                    &f,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                )
                .map_err(|e| bag_err(&f, format!("opening sqlite3 storage: {e}")))?;
                Storage::Sqlite(conn)
            } else {
                let bytes = std::fs::read(&f)
                    .map_err(|e| Error::io(format!("reading {}", f.display()), e))?;
                if !bytes.starts_with(mcap::MAGIC) {
                    return Err(bag_err(&f, "not an MCAP file (bad magic) and not .db3"));
                }
                Storage::Mcap(bytes)
            };
            opened.push((f, storage));
        }
        Ok(Bag { path: path.to_path_buf(), files: opened })
    }

    /// The bag's path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The image topic to read: `wanted` when it is an image topic of the bag
    /// (`sensor_msgs/msg/Image`, or `sensor_msgs/msg/CompressedImage` as image_transport's
    /// `compressed` transport and robot datasets record `<camera>/image_raw/compressed`),
    /// else the bag's only image topic of either type; an error names the choices
    /// (`--topic`) with their types.
    pub fn image_topic(&self, wanted: Option<&str>) -> Result<TopicInfo> {
        let topics = self.topics()?;
        let images: Vec<&TopicInfo> = topics.iter().filter(|t| t.is_image()).collect();
        let listed = |ts: &[&TopicInfo]| {
            ts.iter().map(|t| format!("{} ({})", t.name, t.type_name)).collect::<Vec<_>>()
        };
        if let Some(found) = wanted.and_then(|w| images.iter().find(|t| t.name == w)) {
            return Ok((*found).clone());
        }
        let message = match (wanted, images.as_slice()) {
            (None, [only]) => return Ok((*only).clone()),
            (Some(w), _) => format!(
                "--topic {w}: not a {IMAGE_TYPE}, {COMPRESSED_IMAGE_TYPE}, {FOXGLOVE_VIDEO_TYPE} \
                 or {FFMPEG_PACKET_TYPE} topic of this bag; image topics: {:?}",
                listed(&images)
            ),
            (None, []) => format!(
                "no {IMAGE_TYPE}, {COMPRESSED_IMAGE_TYPE}, {FOXGLOVE_VIDEO_TYPE} or \
                 {FFMPEG_PACKET_TYPE} topic; topics: {:?}",
                listed(&topics.iter().collect::<Vec<_>>())
            ),
            (None, many) => {
                format!("several image topics, choose one with --topic: {:?}", listed(many))
            }
        };
        Err(bag_err(&self.path, message))
    }

    /// The topics, from the storage's own records (MCAP channels / sqlite3 `topics`).
    pub fn topics(&self) -> Result<Vec<TopicInfo>> {
        let mut topics = BTreeMap::new();
        for (f, storage) in &self.files {
            match storage {
                Storage::Sqlite(conn) => {
                    let mut stmt = conn
                        .prepare("SELECT name, type FROM topics")
                        .map_err(|e| bag_err(f, format!("reading topics: {e}")))?;
                    let rows = stmt
                        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                        .map_err(|e| bag_err(f, format!("reading topics: {e}")))?;
                    for row in rows {
                        let (name, ty) =
                            row.map_err(|e| bag_err(f, format!("reading topics: {e}")))?;
                        topics.insert(name, ty);
                    }
                }
                Storage::Mcap(bytes) => {
                    // The summary when the file has one, else a scan (e.g. a truncated file).
                    let summary = mcap::Summary::read(bytes).ok().flatten();
                    match summary {
                        Some(s) => {
                            for ch in s.channels.values() {
                                let ty =
                                    ch.schema.as_ref().map(|s| s.name.clone()).unwrap_or_default();
                                topics.insert(ch.topic.clone(), ty);
                            }
                        }
                        None => {
                            for m in mcap_stream(bytes) {
                                let Ok(m) = m else { break };
                                let ty = m
                                    .channel
                                    .schema
                                    .as_ref()
                                    .map(|s| s.name.clone())
                                    .unwrap_or_default();
                                topics.insert(m.channel.topic.clone(), ty);
                            }
                        }
                    }
                }
            }
        }
        Ok(topics.into_iter().map(|(name, type_name)| TopicInfo { name, type_name }).collect())
    }

    /// Call `f` with every message of the `wanted` topics, in storage order. Damage
    /// (truncation, unreadable records) stops that file and is returned as the reasons,
    /// after `f` has seen every message before it.
    pub fn for_each(
        &self,
        wanted: &[&str],
        mut f: impl FnMut(RawMessage) -> Result<()>,
    ) -> Result<Vec<String>> {
        let mut damage = Vec::new();
        for (path, storage) in &self.files {
            match storage {
                Storage::Sqlite(conn) => {
                    let mut stmt = conn
                        .prepare(
                            "SELECT topics.name, messages.timestamp, messages.data FROM messages \
                             JOIN topics ON messages.topic_id = topics.id ORDER BY messages.timestamp, messages.id",
                        )
                        .map_err(|e| bag_err(path, format!("reading messages: {e}")))?;
                    let mut rows = stmt
                        .query([])
                        .map_err(|e| bag_err(path, format!("reading messages: {e}")))?;
                    loop {
                        match rows.next() {
                            Ok(Some(row)) => {
                                let topic: String = row.get(0).unwrap_or_default();
                                if !wanted.contains(&topic.as_str()) {
                                    continue;
                                }
                                let log_time: i64 = row.get(1).unwrap_or(0);
                                let data: Vec<u8> = row.get(2).unwrap_or_default();
                                f(RawMessage { topic, log_time: log_time.max(0) as u64, data })?;
                            }
                            Ok(None) => break,
                            Err(e) => {
                                damage.push(format!("{}: stopped reading: {e}", path.display()));
                                break;
                            }
                        }
                    }
                }
                Storage::Mcap(bytes) => {
                    for m in mcap_stream(bytes) {
                        match m {
                            Ok(m) => {
                                if wanted.contains(&m.channel.topic.as_str()) {
                                    f(RawMessage {
                                        topic: m.channel.topic.clone(),
                                        log_time: m.log_time,
                                        data: m.data.into_owned(),
                                    })?;
                                }
                            }
                            Err(e) => {
                                damage.push(format!(
                                    "{}: stopped reading: {e} (truncated or damaged file)",
                                    path.display()
                                ));
                                break;
                            }
                        }
                    }
                }
            }
        }
        Ok(damage)
    }
}

fn mcap_stream<'a>(
    bytes: &'a [u8],
) -> impl Iterator<Item = mcap::McapResult<mcap::Message<'static>>> + 'a {
    let opts = mcap::read::Options::IgnoreEndMagic.into();
    let stream = mcap::MessageStream::new_with_options(bytes, opts);
    let (first_err, stream) = match stream {
        Ok(s) => (None, Some(s)),
        Err(e) => (Some(Err(e)), None),
    };
    first_err.into_iter().chain(stream.into_iter().flatten())
}
