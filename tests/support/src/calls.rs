//! The fake NVML's call log (`FAKE_NVML_CALL_LOG`, tests/fake-nvml/README.md):
//! which NVML functions a run called, on which device, how often.

use std::path::Path;

/// One run's calls, in the order they were made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Calls(pub Vec<(String, String)>);

impl Calls {
    /// The log at `path`; empty when the run wrote none.
    ///
    /// # Panics
    /// When a line is not `function device`.
    pub fn read(path: &Path) -> Calls {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        Calls(
            text.lines()
                .map(|line| {
                    let (call, device) = line
                        .split_once(' ')
                        .unwrap_or_else(|| panic!("call log line {line:?}"));
                    (call.to_owned(), device.to_owned())
                })
                .collect(),
        )
    }

    /// How often `call` was made on `device` (`"-"`, `"0"`, `"0/1"`).
    pub fn count(&self, call: &str, device: &str) -> usize {
        self.0
            .iter()
            .filter(|(c, d)| c == call && d == device)
            .count()
    }

    /// How often `call` was made, on any device.
    pub fn total(&self, call: &str) -> usize {
        self.0.iter().filter(|(c, _)| c == call).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_is_counted_by_call_and_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calls");
        std::fs::write(&path, "nvmlDeviceGetCount_v2 -\na 0\na 1\na 0\nb 0/1\n").unwrap();
        let calls = Calls::read(&path);
        assert_eq!((calls.count("a", "0"), calls.count("a", "1")), (2, 1));
        assert_eq!((calls.total("a"), calls.count("b", "0/1")), (3, 1));
        assert_eq!(calls.count("nvmlDeviceGetCount_v2", "-"), 1);
        assert_eq!(Calls::read(&dir.path().join("none")), Calls::default());
    }
}
