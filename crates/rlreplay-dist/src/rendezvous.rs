//! A value published by rank 0 through a directory every rank can read (the run directory):
//! how the NCCL unique id reaches the other ranks when no MPI launcher started the job.
//!
//! Rank 0 writes `<name>-<launch>` atomically (a temporary file, then a rename), the other ranks
//! poll for it. `<launch>` identifies this launch from the launcher's environment
//! (`TORCHELASTIC_RUN_ID`; `SLURM_JOB_ID`.`SLURM_STEP_ID`; `MASTER_ADDR`-`MASTER_PORT`), so a
//! file left by an earlier crashed run is never read; rank 0 removes the file once every rank
//! has read it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{DistError, Result};

/// An identifier of this launch, the same on every rank, from the variables `var` returns.
pub fn launch_key(var: impl Fn(&str) -> Option<String>) -> String {
    let key = if let Some(id) = var("TORCHELASTIC_RUN_ID") {
        id
    } else if let Some(job) = var("SLURM_JOB_ID") {
        format!("{job}.{}", var("SLURM_STEP_ID").unwrap_or_default())
    } else {
        match (var("MASTER_ADDR"), var("MASTER_PORT")) {
            (Some(a), Some(p)) => format!("{a}-{p}"),
            _ => "local".into(),
        }
    };
    key.replace(
        |c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'),
        "_",
    )
}

/// The file of value `name` for launch `key` in `dir`.
pub fn path(dir: &Path, name: &str, key: &str) -> PathBuf {
    dir.join(format!("{name}-{key}"))
}

/// Writes `bytes` to `path` atomically.
pub fn publish(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let io = |e: std::io::Error| DistError::Io(format!("writing {}: {e}", path.display()));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The contents of `path` once it exists; an error after `timeout`.
pub fn wait_for(path: &Path, timeout: Duration) -> Result<Vec<u8>> {
    let start = Instant::now();
    loop {
        if let Ok(bytes) = std::fs::read(path) {
            return Ok(bytes);
        }
        if start.elapsed() > timeout {
            return Err(DistError::Timeout(format!(
                "rank 0 did not publish {} within {:.0} s",
                path.display(),
                timeout.as_secs_f64()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_names_the_launch() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(launch_key(env(&[("TORCHELASTIC_RUN_ID", "abc")])), "abc");
        assert_eq!(
            launch_key(env(&[("SLURM_JOB_ID", "12"), ("SLURM_STEP_ID", "3")])),
            "12.3"
        );
        assert_eq!(
            launch_key(env(&[
                ("MASTER_ADDR", "10.0.0.1"),
                ("MASTER_PORT", "29500")
            ])),
            "10.0.0.1-29500"
        );
        assert_eq!(
            launch_key(env(&[("TORCHELASTIC_RUN_ID", "a/b:c")])),
            "a_b_c"
        );
        assert_eq!(launch_key(env(&[])), "local");
    }

    #[test]
    fn a_published_value_is_read_back() {
        let dir = std::env::temp_dir().join(format!("rlreplay-rdv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = path(&dir, "nccl-id", "k");
        assert!(wait_for(&p, Duration::from_millis(50)).is_err());
        let reader = {
            let p = p.clone();
            std::thread::spawn(move || wait_for(&p, Duration::from_secs(10)))
        };
        publish(&p, &[7; 128]).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), vec![7; 128]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
