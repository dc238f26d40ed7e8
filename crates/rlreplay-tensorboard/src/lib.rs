//! TensorBoard event files: scalars per step written in the documented event-file format, and
//! read back.
//!
//! An event file (`events.out.tfevents.SECONDS.HOST.PID`) is a sequence of TFRecords, each
//! `u64` data length (little endian), the masked CRC-32C of those 8 bytes, the data, and the
//! masked CRC-32C of the data, where `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8`. Each
//! record's data is a serialized `tensorflow.Event` protobuf: the first holds the file version
//! `brain.Event:2`, each later one a step's `Summary` with one `simple_value` (float32, the form
//! TensorBoard's scalar dashboard reads) per tag.
#![warn(missing_docs)]

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use prost::Message;

/// The `file_version` of the first event of a file.
pub const FILE_VERSION: &str = "brain.Event:2";

/// The protobuf messages of an event file (the fields used here, with TensorFlow's tags).
pub mod proto {
    /// `tensorflow.Event`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        /// Seconds since the epoch.
        #[prost(double, tag = "1")]
        pub wall_time: f64,
        /// Global step.
        #[prost(int64, tag = "2")]
        pub step: i64,
        /// What the event holds.
        #[prost(oneof = "What", tags = "3, 5, 6")]
        pub what: Option<What>,
    }

    /// The payload of an [`Event`].
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum What {
        /// The format version, in the first event of a file.
        #[prost(string, tag = "3")]
        FileVersion(String),
        /// Summary values.
        #[prost(message, tag = "5")]
        Summary(Summary),
        /// A session marker: `START` at step N tells TensorBoard to drop the events of earlier
        /// files at steps N and later (a run resumed from a checkpoint).
        #[prost(message, tag = "6")]
        SessionLog(SessionLog),
    }

    /// `tensorflow.SessionLog`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionLog {
        /// `SessionLog.SessionStatus`: [`SESSION_START`] restarts the run at the event's step.
        #[prost(int32, tag = "1")]
        pub status: i32,
    }

    /// `SessionLog.SessionStatus.START`.
    pub const SESSION_START: i32 = 1;

    /// `tensorflow.Summary`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Summary {
        /// The values.
        #[prost(message, repeated, tag = "1")]
        pub value: Vec<Value>,
    }

    /// `tensorflow.Summary.Value` with a scalar.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Value {
        /// The tag (metric name).
        #[prost(string, tag = "1")]
        pub tag: String,
        /// The scalar.
        #[prost(float, optional, tag = "2")]
        pub simple_value: Option<f32>,
    }
}

/// Errors of event files, with the file they concern.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file cannot be created, written or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a valid event file.
    #[error("{}: byte {offset}: {msg}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the bad record starts.
        offset: u64,
        /// What is wrong.
        msg: String,
    },
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// The masked CRC-32C (Castagnoli) of TFRecord framing.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends scalar events to one event file.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Seconds since the epoch, now.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && !h.contains(['/', '\\']))
        .unwrap_or_else(|| "localhost".into())
}

impl EventWriter {
    /// A new event file in `dir` (created when missing), named as TensorBoard expects; a
    /// second file of the same second and process gets a numbered name that sorts after it.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let t = now();
        let name = format!(
            "events.out.tfevents.{}.{}.{}",
            t as u64,
            hostname(),
            std::process::id()
        );
        let mut path = dir.join(&name);
        let mut n = 1;
        while path.exists() {
            path = dir.join(format!("{name}.{n}"));
            n += 1;
        }
        Self::create_file(&path, t)
    }

    /// A new event file at `path` (replacing one there) whose version event carries
    /// `wall_time`.
    pub fn create_file(path: &Path, wall_time: f64) -> Result<Self> {
        let file = File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut w = Self {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        };
        w.write_event(&proto::Event {
            wall_time,
            step: 0,
            what: Some(proto::What::FileVersion(FILE_VERSION.into())),
        })?;
        w.flush()?;
        Ok(w)
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one step's scalars as one event (a summary value per tag).
    pub fn add_scalars<'a>(
        &mut self,
        step: i64,
        wall_time: f64,
        scalars: impl IntoIterator<Item = (&'a str, f64)>,
    ) -> Result<()> {
        let value = scalars
            .into_iter()
            .map(|(tag, v)| proto::Value {
                tag: tag.to_string(),
                simple_value: Some(v as f32),
            })
            .collect();
        self.write_event(&proto::Event {
            wall_time,
            step,
            what: Some(proto::What::Summary(proto::Summary { value })),
        })
    }

    /// Marks a restart at `step` (a `SessionLog` `START` event): TensorBoard discards what
    /// earlier files of the directory hold at `step` and later, so a run resumed from the
    /// checkpoint of step `step - 1` shows each step once.
    pub fn restart_at(&mut self, step: i64, wall_time: f64) -> Result<()> {
        self.write_event(&proto::Event {
            wall_time,
            step,
            what: Some(proto::What::SessionLog(proto::SessionLog {
                status: proto::SESSION_START,
            })),
        })
    }

    /// Writes one event as a TFRecord.
    pub fn write_event(&mut self, event: &proto::Event) -> Result<()> {
        let data = event.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let io = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        self.out.write_all(&len).map_err(io)?;
        self.out
            .write_all(&masked_crc32c(&len).to_le_bytes())
            .map_err(io)?;
        self.out.write_all(&data).map_err(io)?;
        self.out
            .write_all(&masked_crc32c(&data).to_le_bytes())
            .map_err(io)
    }

    /// Hands the buffered events to the operating system (TensorBoard sees them).
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

/// Reads every event of a file, checking the framing and both CRCs of every record.
pub fn read_events(path: &Path) -> Result<Vec<proto::Event>> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let corrupt = |offset: usize, msg: &str| Error::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        msg: msg.to_string(),
    };
    let u32_at = |at: usize| -> Option<u32> {
        bytes
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let mut events = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let head = bytes
            .get(at..at + 8)
            .ok_or_else(|| corrupt(at, "truncated record length"))?;
        if u32_at(at + 8) != Some(masked_crc32c(head)) {
            return Err(corrupt(at, "bad length checksum"));
        }
        let len = u64::from_le_bytes(head.try_into().map_err(|_| corrupt(at, "length"))?);
        let start = at + 12;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| start.checked_add(l))
            .filter(|&e| e + 4 <= bytes.len())
            .ok_or_else(|| corrupt(at, "truncated record"))?;
        let data = &bytes[start..end];
        if u32_at(end) != Some(masked_crc32c(data)) {
            return Err(corrupt(at, "bad data checksum"));
        }
        let event = proto::Event::decode(data).map_err(|e| corrupt(at, &e.to_string()))?;
        events.push(event);
        at = end + 4;
    }
    Ok(events)
}

/// One scalar read back from an event file.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    /// The step.
    pub step: i64,
    /// Seconds since the epoch.
    pub wall_time: f64,
    /// The tag.
    pub tag: String,
    /// The value (stored as float32).
    pub value: f32,
}

/// Every scalar of an event file, in file order.
pub fn read_scalars(path: &Path) -> Result<Vec<Scalar>> {
    let mut out = Vec::new();
    for e in read_events(path)? {
        if let Some(proto::What::Summary(s)) = e.what {
            for v in s.value {
                if let Some(value) = v.simple_value {
                    out.push(Scalar {
                        step: e.step,
                        wall_time: e.wall_time,
                        tag: v.tag,
                        value,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The event files of a directory (names containing `tfevents`), sorted by name.
pub fn event_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("tfevents"))
        })
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_of_known_data() {
        // CRC-32C("123456789") = 0xe3069283 (RFC 3720); masked as TFRecord does.
        let c: u32 = 0xe306_9283;
        assert_eq!(crc32c::crc32c(b"123456789"), c);
        // ((c >> 15) | (c << 17)) + 0xa282ead8, worked out by hand.
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn scalars_round_trip_and_corruption_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.add_scalars(1, 10.0, [("a/b", 0.5), ("c", -2.25)])
            .unwrap();
        w.add_scalars(2, 11.0, [("a/b", f64::NAN)]).unwrap();
        w.flush().unwrap();
        let path = w.path().to_path_buf();
        drop(w);
        assert_eq!(event_files(dir.path()).unwrap(), vec![path.clone()]);
        let events = read_events(&path).unwrap();
        assert_eq!(
            events[0].what,
            Some(proto::What::FileVersion(FILE_VERSION.into()))
        );
        let s = read_scalars(&path).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].step, s[0].tag.as_str(), s[0].value), (1, "a/b", 0.5));
        assert_eq!((s[1].tag.as_str(), s[1].value), ("c", -2.25));
        assert!(s[2].value.is_nan() && s[2].wall_time == 11.0);

        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = read_events(&path).unwrap_err().to_string();
        assert!(e.contains("bad data checksum"), "{e}");
        std::fs::write(&path, &bytes[..n - 2]).unwrap();
        let e = read_events(&path).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn restart_marker_is_a_session_start_at_its_step() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.restart_at(4, 12.0).unwrap();
        w.add_scalars(4, 12.5, [("a", 1.0)]).unwrap();
        let path = w.path().to_path_buf();
        drop(w);
        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[1].step, 4);
        assert_eq!(
            events[1].what,
            Some(proto::What::SessionLog(proto::SessionLog { status: 1 }))
        );
        assert_eq!(read_scalars(&path).unwrap().len(), 1);
    }
}
